"""A typo never starts a new audit log: the bot's commands refuse a database that is not there
(no SQLite file, no folder, or no bot schema in it or in PostgreSQL) with exit 2 naming
`runbook db init`, which (or `database: {create: true}`, or `serve --init-db`) is the only way
one is made; a database's folder is never made, but for the bot's own state folder."""

from __future__ import annotations

import ast
import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bot.store import db
from tests import postgres

ROOT = Path(__file__).resolve().parents[3]


def runbook(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bot", *argv], capture_output=True, text=True,
                          env=env, timeout=60, check=False, stdin=subprocess.DEVNULL)


def site(tmp_path: Path, url: str, **extra: object) -> dict[str, str]:
    config = tmp_path / "bot.yaml"
    config.write_text(yaml.safe_dump({"database_url": url, "inventory": {
        "nodes": ["gpu01"], "discover": False}, **extra}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}
    return {**env, "RUNBOOK_CONFIG": str(config), "XDG_STATE_HOME": str(tmp_path / "state")}


COMMANDS = (["list"], ["status", "1"], ["history"], ["audit", "verify"], ["node", "gpu01"],
            ["run", "selftest"], ["engine", "--once"])


def test_a_mistyped_folder_is_refused_by_every_command_and_never_made(tmp_path: Path) -> None:
    typo = tmp_path / "typo" / "dir"
    env = site(tmp_path, f"sqlite:///{typo / 'bot.db'}")
    for argv in [*COMMANDS, ["db", "init"]]:
        done = runbook(*argv, env=env)
        assert done.returncode == 2, (argv, done.stdout, done.stderr)
        assert done.stderr == (
            f"error: the folder {typo} of the database sqlite:///{typo / 'bot.db'} does not "
            "exist: the bot never creates a database's folder (a mistyped path would start a "
            "new audit log); create it, then `runbook db init`\n"), argv
    assert not (tmp_path / "typo").exists()


def test_a_missing_file_is_refused_until_db_init_makes_it(tmp_path: Path) -> None:
    file = tmp_path / "bot.db"
    env = site(tmp_path, f"sqlite:///{file}")
    for argv in COMMANDS:
        done = runbook(*argv, env=env)
        assert done.returncode == 2, (argv, done.stderr)
        assert done.stderr.startswith(f"error: there is no database sqlite:///{file}: "
                                      "`runbook db init` creates it"), argv
        assert not file.exists()
    made = runbook("db", "init", env=env)
    assert (made.returncode, made.stdout) == (
        0, f"created the database sqlite:///{file} (schema {db.HEAD_REVISION})\n")
    again = runbook("db", "init", env=env)
    assert (again.returncode, again.stdout) == (
        0, f"the database sqlite:///{file} is there (schema {db.HEAD_REVISION}): nothing "
           "created\n")
    assert runbook("run", "selftest", "--wait", env=env).returncode == 0
    assert runbook("audit", "verify", env=env).returncode == 0


def test_a_file_without_the_bots_schema_is_not_a_database(tmp_path: Path) -> None:
    file = tmp_path / "bot.db"
    file.write_bytes(b"")  # an empty file: SQLite would take it as a new database
    done = runbook("history", env=site(tmp_path, f"sqlite:///{file}"))
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: the database sqlite:///{file} holds no bot schema "
                                  "(it was never initialised): `runbook db init` creates it")
    assert file.read_bytes() == b""


def test_create_true_lets_any_command_make_it(tmp_path: Path) -> None:
    file = tmp_path / "bot.db"
    env = site(tmp_path, f"sqlite:///{file}", database={"create": True})
    assert runbook("history", env=env).returncode == 0
    assert file.exists()


def test_db_init_makes_the_bots_own_state_folder_for_the_default(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    assert runbook("run", "selftest", env=env).returncode == 2
    assert not (tmp_path / "state").exists()
    assert runbook("db", "init", env=env).returncode == 0
    assert (tmp_path / "state" / "gpu-runbook-bot" / "bot.db").is_file()
    assert runbook("run", "selftest", "--wait", env=env).returncode == 0


def test_serve_init_db_makes_it_after_its_checks(tmp_path: Path) -> None:
    file = tmp_path / "bot.db"
    env = site(tmp_path, f"sqlite:///{file}")
    refused = runbook("serve", "--host", "0.0.0.0", "--port", "1", "--init-db", env=env)
    assert refused.returncode == 2 and "RUNBOOK_ALERTS_TOKEN" in refused.stderr
    assert not file.exists()  # refused before the database was touched
    with socket.socket() as holder:  # the port is taken: serve stops after making it
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        taken = runbook("serve", "--port", str(port), "--init-db", env=env)
    assert taken.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in taken.stderr
    assert file.exists()


@pytest.mark.postgres
def test_postgresql_without_the_schema_is_refused_until_db_init(
        postgres_server: postgres.PostgresServer) -> None:
    url = postgres.fresh_database(postgres_server.url, f"t_{secrets.token_hex(6)}")
    with pytest.raises(db.DatabaseError, match=r"holds no bot schema .* `runbook db init`"):
        db.connect(url, create=False)
    assert db.init(url) is True
    db.connect(url, create=False).dispose()
    assert db.init(url) is False


def test_every_connect_of_the_bot_says_whether_it_may_create() -> None:
    """db.connect creates by default (tests and benchmarks make throw-away databases); every
    call in the bot itself passes create= (the configuration's, or db init's)."""
    calls = []
    for path in (ROOT / "bot").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
                target = node.func.value if isinstance(node.func, ast.Attribute) else None
                if name == "connect" and (target is None or (
                        isinstance(target, ast.Name) and target.id == "db")) and node.args:
                    calls.append((path.relative_to(ROOT), node.lineno,
                                  any(k.arg == "create" for k in node.keywords)))
    assert len(calls) >= 3  # the service, the audit commands, the node view
    assert [call for call in calls if not call[2]] == []


def test_the_default_database_not_made_yet_is_named_with_the_command_that_makes_it(
        tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")  # no configuration: the default database
    url = f"sqlite:///{tmp_path / 'state' / 'gpu-runbook-bot' / 'bot.db'}"
    done = runbook("run", "selftest", env=env)
    assert (done.returncode, done.stderr) == (
        2, f"error: there is no database {url} yet: `runbook db init` creates it (the only "
           "command that does)\n")
    assert not (tmp_path / "state").exists()
    assert runbook("db", "init", env=env).returncode == 0
    assert runbook("run", "selftest", "--wait", env=env).returncode == 0
