"""``NAME=-`` for a secret parameter on the command line: the value is read from stdin (or
the terminal, not echoed), so it is never in argv, the shell's history or the process list;
the run's command gets it, and no output of the command line shows it."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import LAB_USERS, NODES

SECRET = "pr0mpted-Secret-77"
SCRIPT = "import sys; open(sys.argv[1], 'w').write(sys.argv[2])"


def runbook(*args: str, env: dict[str, str], given: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bot", *args], env=env, input=given,
                          capture_output=True, text=True, timeout=120)


def setup(tmp_path: Path) -> dict[str, str]:
    folder = tmp_path / "runbooks"
    folder.mkdir()
    (folder / "keyed.yaml").write_text(yaml.safe_dump({
        "name": "keyed", "version": "1.0.0", "summary": "a token from stdin", "risk": "low",
        "params": {"node": {"type": "node", "required": True},
                   "token": {"type": "text", "secret": True, "required": True}},
        "locks": ["node:{{ node }}"],
        "steps": [{"id": "use", "action": "host.run",
                   "with": {"command": "keep", "args": ["{{ token }}"]}}]}))
    (tmp_path / "key").write_text("q" * 44)
    (tmp_path / "bot.yaml").write_text(yaml.safe_dump({
        "lab": True, "database_url": f"sqlite:///{tmp_path / 'bot.db'}",
        "runbook_paths": [str(folder)], "users": LAB_USERS, "inventory": {"nodes": NODES},
        "requesters": ["group:oncall"], "secrets": {"key_file": str(tmp_path / "key")},
        "host_commands": {"keep": {"argv": [sys.executable, "-c", SCRIPT,
                                            str(tmp_path / "got")], "accepts_args": True}}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}
    env["RUNBOOK_CONFIG"] = str(tmp_path / "bot.yaml")
    assert runbook("db", "init", env=env).returncode == 0
    return env


def test_a_secret_given_as_dash_is_read_from_stdin(tmp_path: Path) -> None:
    env = setup(tmp_path)
    planned = runbook("plan", "keyed", "node=gpu01", "token=-", env=env, given=SECRET + "\n")
    assert planned.returncode == 0, planned.stderr
    assert "[secret:token:" in planned.stdout and SECRET not in planned.stdout
    done = runbook("run", "keyed", "node=gpu01", "token=-", "--wait", "--as", "alice",
                   env=env, given=SECRET + "\n")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "got").read_text() == SECRET  # the command got the value
    assert SECRET not in done.stdout + done.stderr
    with sqlite3.connect(tmp_path / "bot.db") as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            assert SECRET not in repr(conn.execute(f'SELECT * FROM "{table}"').fetchall())


def test_nothing_on_stdin_is_refused_with_exit_2(tmp_path: Path) -> None:
    env = setup(tmp_path)
    done = runbook("run", "keyed", "node=gpu01", "token=-", "--as", "alice", env=env)
    assert done.returncode == 2 and "token=-: nothing to read on stdin" in done.stderr
