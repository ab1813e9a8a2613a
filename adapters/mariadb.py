"""``mariadb.dump`` and ``mariadb.restore``: logical backups with the MariaDB client tools
(used by restore-slurmdbd), run as argument lists in a clean environment.

The password never goes in argv nor in the child's environment (no ``MYSQL_PWD``).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from adapters.actions import ActionContext, ActionError, ActionResult, StrictArguments
from adapters.environment import child_environment
from adapters.host import confined
from adapters.registry import Adapter, Built


class MariaDBConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    socket: str | None = None
    host: str = "127.0.0.1"
    port: int = 3306
    user: str = "root"
    password_env: str | None = None  # name of an environment variable holding the password
    dump_command: str = "mariadb-dump"
    client_command: str = "mariadb"
    timeout: float = Field(default=3600, gt=0)
    # mariadb.dump writes only inside this folder (safety copies, dumps before an upgrade)
    backup_dir: str = Field(default="/var/backups/slurmdbd", pattern=r"^/")

    def connection_args(self) -> list[str]:
        if self.socket:
            return [f"--socket={self.socket}", f"--user={self.user}"]
        return [f"--host={self.host}", f"--port={self.port}", f"--user={self.user}"]

    def password(self) -> str | None:
        """The password from the bot's environment, or None when none is configured."""
        if not self.password_env:
            return None
        value = os.environ.get(self.password_env)
        if value is None:
            raise ActionError(f"mariadb.password_env names {self.password_env}, which is not "
                              "set in the bot's environment")
        return value


def option_file_text(password: str) -> str:
    """A ``[client]`` option file giving ``password``, quoted and escaped as the MariaDB
    client library reads it back."""
    escaped = (password.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
               .replace("\r", "\\r").replace("\t", "\\t"))
    return f'[client]\npassword="{escaped}"\n'


class DumpArguments(StrictArguments):
    database: str = Field(pattern=r"^[A-Za-z0-9_]{1,64}$")
    path: str = Field(min_length=1)


class RestoreArguments(StrictArguments):
    database: str = Field(pattern=r"^[A-Za-z0-9_]{1,64}$")
    path: str = Field(min_length=1)


def _run(argv: list[str], config: MariaDBConfig, timeout: float, *, stdin_path: Path | None = None,
         stdout_path: Path | None = None) -> None:
    """Run a client tool on files opened here (no shell redirection). A password goes in an
    option file, mode 0600 in a private folder removed when the tool ends, passed with
    ``--defaults-extra-file``."""
    shown = shlex.join(argv)
    password = config.password()
    try:
        with tempfile.TemporaryDirectory(prefix="grb-mariadb-") as private, \
                (open(stdin_path, "rb") if stdin_path else open(os.devnull, "rb")) as stdin, \
                (open(stdout_path, "wb") if stdout_path else open(os.devnull, "wb")) as stdout:
            full = list(argv)
            if password is not None:
                options = Path(private) / "client.cnf"  # the folder is 0700, the file 0600
                fd = os.open(options, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as handle:
                    handle.write(option_file_text(password))
                # The client reads --defaults-extra-file only as its first argument.
                full = [argv[0], f"--defaults-extra-file={options}", *argv[1:]]
            done = subprocess.run(full, stdin=stdin, stdout=stdout, stderr=subprocess.PIPE,
                                  env=child_environment(), timeout=timeout, check=False)
    except FileNotFoundError as exc:
        raise ActionError(f"{shown}: {exc.strerror}: {exc.filename}") from exc
    except subprocess.TimeoutExpired as exc:
        raise ActionError(f"{shown}: timed out after {timeout:.0f}s") from exc
    if done.returncode != 0:
        raise ActionError(f"{shown} exited {done.returncode}: "
                          f"{done.stderr.decode(errors='replace').strip()[-2000:]}")


class DumpAction:
    name: ClassVar[str] = "mariadb.dump"
    Arguments: ClassVar[type[StrictArguments]] = DumpArguments

    def __init__(self, config: MariaDBConfig) -> None:
        self._config = config

    def _argv(self, args: DumpArguments) -> list[str]:
        return [self._config.dump_command, *self._config.connection_args(),
                "--single-transaction", "--routines", "--databases", args.database]

    def _target(self, args: DumpArguments) -> Path:
        return confined(args.path, self._config.backup_dir, "mariadb.backup_dir")

    def plan(self, args: DumpArguments) -> list[str]:
        return [f"{shlex.join(self._argv(args))} > {self._target(args)}"]

    def run(self, args: DumpArguments, ctx: ActionContext) -> ActionResult:
        target = self._target(args)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        _run(self._argv(args), self._config, min(self._config.timeout, ctx.remaining()),
             stdout_path=partial)
        partial.replace(target)  # a dump cut short never stands as the safety copy
        size = target.stat().st_size
        return ActionResult(summary=f"dumped {args.database} to {target} ({size} bytes)",
                            details={"path": str(target), "bytes": size})


class RestoreAction:
    name: ClassVar[str] = "mariadb.restore"
    # not safe to run twice blindly: after a crash in this step a person decides
    idempotent: ClassVar[bool] = False
    Arguments: ClassVar[type[StrictArguments]] = RestoreArguments

    def __init__(self, config: MariaDBConfig) -> None:
        self._config = config

    def _argv(self, args: RestoreArguments) -> list[str]:
        return [self._config.client_command, *self._config.connection_args(), args.database]

    def plan(self, args: RestoreArguments) -> list[str]:
        return [f"{shlex.join(self._argv(args))} < {args.path}"]

    def run(self, args: RestoreArguments, ctx: ActionContext) -> ActionResult:
        source = Path(args.path)
        if not source.is_file():
            raise ActionError(f"backup {source} does not exist: nothing was restored")
        # The dump names its database (--databases), so the client recreates it as saved.
        _run(self._argv(args), self._config, min(self._config.timeout, ctx.remaining()),
             stdin_path=source)
        return ActionResult(summary=f"restored {args.database} from {source}",
                            details={"path": str(source), "bytes": source.stat().st_size})


ACTION_CLASSES: tuple[type[DumpAction | RestoreAction], ...] = (DumpAction, RestoreAction)


def _build(config: MariaDBConfig, backends: Mapping[str, Any]) -> Built:
    return Built([cls(config) for cls in ACTION_CLASSES])


ADAPTER = Adapter("mariadb", "mariadb", MariaDBConfig, ACTION_CLASSES, _build)
