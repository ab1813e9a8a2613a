"""``host.run``: run an allow-listed command on the bot's host, as an argument list.

Only commands the configuration names can run, never a path from a runbook and never
through a shell (a parameter like ``$(id)`` stays a string), in a clean environment.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from adapters.actions import ActionContext, ActionError, ActionResult, StrictArguments
from adapters.environment import EnvVars, child_environment

OUTPUT_LIMIT = 16_384  # characters of stdout/stderr kept in the audit log


class HostCommand(BaseModel):
    """An allow-listed command as the configuration declares it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    argv: list[str] = Field(min_length=1)
    accepts_args: bool = False
    timeout: float = Field(default=60.0, gt=0)
    description: str = ""
    # Set for this command only, on top of the allow-listed part of the bot's environment
    # (for a node command: also exported by srun to the job step).
    env: EnvVars = Field(default_factory=dict)


def allowed_argv(
    commands: Mapping[str, HostCommand], name: str, args: Sequence[str], kind: str, section: str
) -> tuple[HostCommand, list[str]]:
    """The argv of an allow-listed command, or ActionError naming the configuration to change."""
    command = commands.get(name)
    if command is None:
        allowed = ", ".join(sorted(commands)) or "none"
        raise ActionError(f'{kind} "{name}" is not allow-listed in the configuration '
                          f"({section}; allowed: {allowed})")
    if args and not command.accepts_args:
        raise ActionError(f'{kind} "{name}" takes no extra arguments (set accepts_args: true '
                          f"in its {section} entry to allow them)")
    return command, [*command.argv, *args]


class HostRunArguments(StrictArguments):
    command: str
    args: list[str] = Field(default_factory=list)


class HostRunAction:
    """A configured command by its name (``command: dcgm-diag``); extra arguments only when
    it says ``accepts_args: true``. It gets the allow-listed variables and its ``env:``."""

    name: ClassVar[str] = "host.run"
    # not safe to run twice blindly: after a crash in this step a person decides
    idempotent: ClassVar[bool] = False
    Arguments: ClassVar[type[StrictArguments]] = HostRunArguments

    def __init__(self, commands: Mapping[str, HostCommand]) -> None:
        self._commands = dict(commands)

    def _argv(self, args: HostRunArguments) -> tuple[HostCommand, list[str]]:
        return allowed_argv(self._commands, args.command, args.args, "host command",
                            "host_commands")

    def plan(self, args: HostRunArguments) -> list[str]:
        command, argv = self._argv(args)
        line = f"run on the bot host: {shlex.join(argv)}"
        if command.env:
            line += f" (environment sets {', '.join(sorted(command.env))})"
        return [line]

    def run(self, args: HostRunArguments, ctx: ActionContext) -> ActionResult:
        command, argv = self._argv(args)
        timeout = min(command.timeout, ctx.remaining())
        done = _run(command, argv, timeout)
        details = {
            "argv": argv,
            "exit_code": done.returncode,
            "stdout": done.stdout[-OUTPUT_LIMIT:],
            "stderr": done.stderr[-OUTPUT_LIMIT:],
        }
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
            raise ActionError(
                f"{shlex.join(argv)} exited {done.returncode}: " + " | ".join(tail)
            )
        first = done.stdout.strip().splitlines()[:1]
        return ActionResult(summary=first[0] if first else "exit 0", details=details)


def _run(command: HostCommand, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Start an allow-listed command: argument list, no stdin, clean environment."""
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
            env=child_environment(command.env),
        )
    except FileNotFoundError as exc:
        raise ActionError(f"{shlex.join(argv)}: executable not found ({exc.filename})") from exc
    except subprocess.TimeoutExpired as exc:
        raise ActionError(f"{shlex.join(argv)}: timed out after {timeout:.0f}s") from exc


def run_command(command: HostCommand, argv: list[str],
                timeout: float) -> subprocess.CompletedProcess[str]:
    """Start an allow-listed command (``argv`` from ``allowed_argv``); never raises on its
    exit code, ActionError when it cannot start or times out."""
    return _run(command, argv, timeout)


def run_check_command(command: HostCommand, timeout: float) -> tuple[int, str]:
    """Run an allow-listed command for a check; returns (exit code, combined output tail)."""
    done = _run(command, command.argv, timeout)
    return done.returncode, (done.stdout + done.stderr)[-OUTPUT_LIMIT:]


def verdict(out: str, err: str, code: int) -> str:
    """The most telling line of a failed check: the check's own failing line before srun's."""

    def lines(text: str) -> list[str]:
        return [line.strip(" |") for line in text.splitlines() if line.strip(" |-+=")]

    def failing(text: str) -> list[str]:
        return [line for line in lines(text) if "fail" in line.lower() or "error" in line.lower()]

    found = failing(out) or failing(err) or lines(out) or lines(err) or [f"exit code {code}"]
    return " ".join(found[0].split())[:150]


def confined(path: str, folder: str, setting: str) -> Path:
    """``path`` if it names a file inside ``folder`` (symlinks of the folders on the way
    resolved): a copy the bot writes (a safety copy, a dump) lands there and nowhere
    else. ActionError naming ``setting`` otherwise, before anything is written."""
    given = PurePosixPath(path)
    if not given.is_absolute() or ".." in given.parts or any(ord(c) < 32 for c in path):
        raise ActionError(f"{path[:200]!r} must be an absolute path without '..' inside "
                          f"{folder} ({setting})")
    root = Path(os.path.realpath(folder))
    target = Path(os.path.realpath(given.parent)) / given.name
    if not target.is_relative_to(root) or target == root:
        raise ActionError(f"{path[:200]} is outside {folder}, where the bot writes its copies "
                          f"({setting}): name a file there, or change {setting}")
    if target.is_symlink():
        raise ActionError(f"{path[:200]} is a symbolic link: name the file itself, in {folder}")
    return target
