"""The `runbook` command as people and scripts use it: exit codes, the selftest with no
configuration, bad input, approvals from two terminals, audit tampering, an engine killed
with SIGKILL mid-execution whose work a new process finishes without repeating a step, identity
from the OS account whatever the environment says, and break-glass for a weakened guard."""

from __future__ import annotations

import json
import os
import pwd
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager, redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.store import db
from bot.surfaces import cli as cli_module
from tests.conftest import LAB_USERS, NODES

RUNBOOK = [sys.executable, "-m", "bot"]


def cli(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The real program in its own process: for what is about processes (a second terminal,
    a process killed, identity from the OS account, the exit code the shell sees)."""
    return subprocess.run([*RUNBOOK, *args], env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


@contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def cli_here(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The same command through ``bot.surfaces.cli.main`` in this process, with ``env`` as the
    whole environment: what ``python -m bot`` does (``sys.exit(main())``) without the second
    or two a new process takes to start. Each call builds its own configuration, service and
    database pool (closed at the end of the test by tests.conftest's ``_dispose_engines``)."""
    out, err = StringIO(), StringIO()
    with _environment(env), redirect_stdout(out), redirect_stderr(err):
        try:
            code = cli_module.main(list(args))
        except SystemExit as exc:  # argparse: --help, a usage error
            code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
    return subprocess.CompletedProcess([*RUNBOOK, *args], code, out.getvalue(), err.getvalue())


@pytest.fixture
def bare_env(tmp_path: Path) -> dict[str, str]:
    """No configuration file at all: the defaults, with state under a temporary home."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    assert cli_here("db", "init", env=env).returncode == 0  # a new install's first command
    return env


JOURNAL_SCRIPT = "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n')"
SLOW_SCRIPT = (
    "import os, sys, time\n"
    "open(sys.argv[1], 'a').write('slow-start\\n')\n"
    "marker = sys.argv[1] + '.slow-done-once'\n"
    "if not os.path.exists(marker):\n"
    "    open(marker, 'w').close(); time.sleep(60)\n"
)


@pytest.fixture
def lab_env(tmp_path: Path) -> dict[str, str]:
    """A lab configuration (users alice..dave) with host commands that write a journal."""
    journal = tmp_path / "journal.txt"
    folder = tmp_path / "runbooks"
    folder.mkdir()
    steps = [
        {"id": "first", "action": "host.run", "with": {"command": "mark", "args": ["first"]}},
        {"id": "slow", "action": "host.run", "with": {"command": "slow"}, "timeout": "5m"},
        {"id": "last", "action": "host.run", "with": {"command": "mark", "args": ["last"]}},
    ]
    for name, risk in (("three-steps", "low"), ("guarded", "medium")):
        (folder / f"{name}.yaml").write_text(yaml.safe_dump({
            "name": name, "version": "1.0.0", "summary": "cli test", "risk": risk,
            "params": {"node": {"type": "node", "required": True}},
            "locks": ["node:{{ node }}"],
            "steps": steps if name == "three-steps" else steps[:1],
        }))
    config = {
        "lab": True,
        "database_url": f"sqlite:///{tmp_path / 'bot.db'}",
        "runbook_paths": [str(folder)],
        "users": LAB_USERS,
        "requesters": ["group:oncall", "group:gpu-leads"],
        "approvers": ["group:gpu-leads"],
        "inventory": {"nodes": NODES},
        "engine": {"lease_seconds": 1.5, "poll_seconds": 0.1},
        "host_commands": {
            "mark": {"argv": [sys.executable, "-c", JOURNAL_SCRIPT, str(journal)],
                     "accepts_args": True},
            "slow": {"argv": [sys.executable, "-c", SLOW_SCRIPT, str(journal)]},
        },
    }
    (tmp_path / "bot.yaml").write_text(yaml.safe_dump(config))
    db.init(f"sqlite:///{tmp_path / 'bot.db'}")  # `runbook db init`: commands never create it
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}
    env["RUNBOOK_CONFIG"] = str(tmp_path / "bot.yaml")
    return env


def journal(env: dict[str, str]) -> list[str]:
    path = Path(env["RUNBOOK_CONFIG"]).parent / "journal.txt"
    return path.read_text().splitlines() if path.exists() else []


def test_help_lists_the_commands(bare_env: dict[str, str]) -> None:
    done = cli("--help", env=bare_env)
    assert done.returncode == 0
    for command in ("plan", "run", "approve", "deny", "cancel", "audit", "versions", "diff"):
        assert command in done.stdout


def test_selftest_runs_with_no_configuration(bare_env: dict[str, str]) -> None:
    done = cli_here("run", "selftest", "--wait", env=bare_env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("execution ")
    assert "succeeded" in done.stdout.splitlines()[-1]
    verify = cli_here("audit", "verify", env=bare_env)
    assert verify.returncode == 0 and "intact" in verify.stdout
    show = cli_here("show", done.stdout.split()[1], env=bare_env)
    assert "step_finished" in show.stdout and "check_evaluated" in show.stdout


@pytest.mark.parametrize("args, message", [
    (["run", "selftest", "message=$(id)"], "not allowed"),
    (["run", "selftest", "message"], "is not key=value"),
    (["run", "selftest", "mesage=hi"], 'did you mean "message"'),
    (["run", "selftest", "message=" + "x" * 10_000], "at most"),
    (["run", "nosuch"], 'no runbook "nosuch"'),
    (["plan", "selftest", "message=`reboot`"], "not allowed"),
    (["run", "selftest", "--as", "carol"], "lab: true"),
    (["run", "close-maintenance", "name=rack1"], 'configure the "slurm" section'),
    (["run", "drain-node", "node=gpu01", "reason=x"], "inventory is empty"),
])
def test_bad_input_exits_2_and_changes_nothing(bare_env: dict[str, str], args: list[str],
                                               message: str) -> None:
    done = cli_here(*args, env=bare_env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr
    history = cli_here("history", "--json", env=bare_env)
    assert history.returncode == 0 and history.stdout.strip() == "[]"


def test_bad_input_exits_2_from_the_real_program(bare_env: dict[str, str]) -> None:
    """The exit code and the message as the shell sees them (the cases above run main())."""
    done = cli("run", "selftest", "message=$(id)", env=bare_env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "not allowed" in done.stderr
    history = cli_here("history", "--json", env=bare_env)
    assert history.returncode == 0 and history.stdout.strip() == "[]"


def test_malformed_config_exits_2(tmp_path: Path, bare_env: dict[str, str]) -> None:
    (tmp_path / "bad.yaml").write_text("lab: true\nusers: [alice\n")
    done = cli_here("--config", str(tmp_path / "bad.yaml"), "list", env=bare_env)
    assert done.returncode == 2 and "not valid YAML" in done.stderr


def test_validate_reports_file_and_line(tmp_path: Path, bare_env: dict[str, str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nversion: 1.0.0\nsummary: x\nrisk: low\nsteps:\n"
                   "  - id: a\n    action: chat.notfy\n    with: {message: hi}\n")
    done = cli_here("validate", str(bad), env=bare_env)
    assert done.returncode == 2
    assert f"{bad}:7: steps[0].action: unknown action \"chat.notfy\"" in done.stderr
    assert 'did you mean "chat.notify"' in done.stderr


def test_versions_and_diff(tmp_path: Path, bare_env: dict[str, str]) -> None:
    folder = tmp_path / "rb"
    folder.mkdir()
    source = Path(__file__).resolve().parents[3] / "runbooks" / "selftest.yaml"
    text = source.read_text()
    (folder / "selftest.yaml").write_text(text)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"runbook_paths": [str(folder)]}))
    assert cli_here("--config", str(config), "list", env=bare_env).returncode == 0
    (folder / "selftest.yaml").write_text(
        text.replace("version: 1.0.0", "version: 1.1.0").replace("timeout: 30s", "timeout: 45s"))
    assert cli_here("--config", str(config), "list", env=bare_env).returncode == 0
    versions = cli_here("--config", str(config), "versions", "selftest", env=bare_env)
    assert "1.0.0" in versions.stdout and "1.1.0" in versions.stdout
    diff = cli_here("--config", str(config), "diff", "selftest", "1.0.0", "1.1.0", env=bare_env)
    assert "-    timeout: 30s" in diff.stdout and "+    timeout: 45s" in diff.stdout
    (folder / "selftest.yaml").write_text(text.replace("timeout: 30s", "timeout: 99s"))
    refused = cli_here("--config", str(config), "list", env=bare_env)
    assert refused.returncode == 2 and "Bump the version" in refused.stderr


def test_tampering_is_named_by_audit_verify(bare_env: dict[str, str]) -> None:
    assert cli_here("run", "selftest", "--wait", env=bare_env).returncode == 0
    database = Path(bare_env["XDG_STATE_HOME"]) / "gpu-runbook-bot" / "bot.db"
    with sqlite3.connect(database) as conn:
        conn.execute("UPDATE audit_events SET actor = 'mallory' WHERE seq = 5")
    done = cli_here("audit", "verify", env=bare_env)
    assert done.returncode == 1
    assert "event 5 was edited" in done.stdout


def test_two_terminals_request_and_approve(lab_env: dict[str, str]) -> None:
    waiting = subprocess.Popen([*RUNBOOK, "run", "guarded", "node=gpu02", "--wait", "--as",
                                "alice"], env=lab_env, stdout=subprocess.PIPE, text=True,
                               stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert waiting.stdout is not None
    first = waiting.stdout.readline()
    assert first.startswith("execution ")
    execution_id = first.split()[1]
    # the second terminal: this process
    refused = cli_here("approve", execution_id, "--as", "bob", env=lab_env)
    assert refused.returncode == 2 and "bob may not approve" in refused.stderr
    approved = cli_here("approve", execution_id, "--as", "carol", env=lab_env)
    assert approved.returncode == 0, approved.stderr
    out, _ = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, out
    assert journal(lab_env) == ["first"]


def test_denied_run_exits_1(lab_env: dict[str, str]) -> None:
    waiting = subprocess.Popen([*RUNBOOK, "run", "guarded", "node=gpu03", "--wait", "--as",
                                "bob"], env=lab_env, stdout=subprocess.PIPE, text=True,
                               stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert waiting.stdout is not None
    execution_id = waiting.stdout.readline().split()[1]
    assert cli_here("deny", execution_id, "--as", "dave", "--reason", "change freeze",
                    env=lab_env).returncode == 0
    waiting.communicate(timeout=60)
    assert waiting.returncode == 1
    assert journal(lab_env) == []


def test_sigkill_mid_execution_then_a_new_engine_finishes(lab_env: dict[str, str]) -> None:
    runner = subprocess.Popen([*RUNBOOK, "run", "three-steps", "node=gpu01", "--wait", "--as",
                               "alice"], env=lab_env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                              start_new_session=True)
    assert runner.stdout is not None
    execution_id = runner.stdout.readline().split()[1]
    _wait_for(lambda: "slow-start" in journal(lab_env), 30)
    os.killpg(runner.pid, signal.SIGKILL)  # the engine and the step's child process
    runner.communicate(timeout=10)
    assert cli_here("status", execution_id, env=lab_env).stdout.count("RUNNING") == 1

    # the dead engine's lease (1.5 s, renewed before the kill), as stored, runs out
    lease_until = _lease_until(lab_env, execution_id)
    _wait_for(lambda: time.time() > lease_until, 30)
    engine = cli("engine", "--once", env=lab_env, timeout=120)  # a new engine process
    assert engine.returncode == 0, engine.stderr
    # host.run is not idempotent: the step under way is not re-run blindly
    assert f"[{execution_id}] held for a person: step slow (host.run)" in engine.stdout
    assert journal(lab_env) == ["first", "slow-start"]
    assert cli_here("status", execution_id, env=lab_env).stdout.count("HELD") == 1

    resumed = cli_here("resume", execution_id, "--as", "alice", env=lab_env)
    assert resumed.returncode == 0, resumed.stderr
    engine = cli_here("engine", "--once", env=lab_env)
    assert engine.returncode == 0, engine.stderr
    assert f"[{execution_id}] resumed" in engine.stdout
    assert journal(lab_env) == ["first", "slow-start", "slow-start", "last"]
    status = cli_here("status", execution_id, env=lab_env)
    assert "SUCCEEDED" in status.stdout
    show = cli_here("show", execution_id, env=lab_env).stdout
    assert show.count("step_finished") == 3 and "resumed" in show
    assert cli_here("audit", "verify", env=lab_env).returncode == 0


def _lease_until(env: dict[str, str], execution_id: str) -> float:
    path = Path(env["RUNBOOK_CONFIG"]).parent / "bot.db"
    with closing(sqlite3.connect(path)) as conn:
        row = conn.execute("SELECT lease_until FROM executions WHERE id = ?",
                           (int(execution_id),)).fetchone()
    return float(row[0])


def _wait_for(condition: Any, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.05)


IDENTITY_VARIABLES = ("LOGNAME", "USER", "LNAME", "USERNAME")  # what getpass.getuser() reads


@pytest.fixture
def os_env(tmp_path: Path) -> dict[str, str]:
    """Not a lab: identity is the OS account. Anyone may request and approve (so only the
    self-approval rule stands between a requester and their own approval)."""
    folder = tmp_path / "runbooks"
    folder.mkdir()
    (folder / "guarded.yaml").write_text(yaml.safe_dump({
        "name": "guarded", "version": "1.0.0", "summary": "cli test", "risk": "medium",
        "params": {"node": {"type": "node", "required": True}},
        "steps": [{"id": "first", "action": "chat.notify", "with": {"message": "hi"}}],
    }))
    (tmp_path / "bot.yaml").write_text(yaml.safe_dump({
        "lab": False,
        "database_url": f"sqlite:///{tmp_path / 'bot.db'}",
        "runbook_paths": [str(folder)],
        "users": LAB_USERS,
        "requesters": ["*"],
        "approvers": ["*"],
        "inventory": {"nodes": NODES},
    }))
    db.init(f"sqlite:///{tmp_path / 'bot.db'}")  # `runbook db init`
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}
    env["RUNBOOK_CONFIG"] = str(tmp_path / "bot.yaml")
    return env


def test_identity_is_the_os_account_not_the_environment(os_env: dict[str, str]) -> None:
    real = pwd.getpwuid(os.getuid()).pw_name
    assert real not in ("alice", "carol")
    as_alice = {**os_env, **{name: "alice" for name in IDENTITY_VARIABLES}}
    as_carol = {**os_env, **{name: "carol" for name in IDENTITY_VARIABLES}}
    done = cli("run", "guarded", "node=gpu02", env=as_alice)
    assert done.returncode == 0, done.stderr
    execution_id = done.stdout.split()[1]
    assert f"requested by {real};" in done.stdout
    refused = cli("approve", execution_id, env=as_carol)
    assert refused.returncode == 2, refused.stdout
    assert (f"{real} requested execution {execution_id} and may not approve it too"
            in refused.stderr)
    as_flag = cli_here("approve", execution_id, "--as", "carol", env=as_carol)
    assert as_flag.returncode == 2 and "lab: true" in as_flag.stderr
    status = cli_here("status", execution_id, env=os_env)
    assert "AWAITING_APPROVAL" in status.stdout and f"requested by {real} " in status.stdout
    history = json.loads(cli_here("history", "--json", env=os_env).stdout)
    assert [row["requested_by"] for row in history] == [real]


FLOOR_RUNBOOK = {
    "name": "floor", "version": "1.0.0", "summary": "cli test", "risk": "medium",
    "params": {"node": {"type": "node", "required": True},
               "min_free_gpus": {"type": "int", "default": 8, "min": 0, "weakens_guard": "lower",
                                 "description": "free GPUs the pool must keep"}},
    "steps": [{"id": "first", "action": "host.run",
               "with": {"command": "mark", "args": ["floor {{ min_free_gpus }}"]}}],
}
WEAKENED = ("min_free_gpus=0 weakens a guard (free GPUs the pool must keep): it is lower than "
            "its default 8")


def test_a_weakened_guard_needs_break_glass_and_one_more_approval(
        lab_env: dict[str, str]) -> None:
    folder = Path(lab_env["RUNBOOK_CONFIG"]).parent / "runbooks"
    (folder / "floor.yaml").write_text(yaml.safe_dump(FLOOR_RUNBOOK))
    asked = ["floor", "node=gpu01", "min_free_gpus=0"]
    for words in (["plan"], ["run", "--as", "alice"]):
        refused = cli_here(*words, *asked, env=lab_env)
        assert refused.returncode == 2, refused.stdout
        assert WEAKENED in refused.stderr and "(--break-glass)" in refused.stderr
    assert cli_here("history", "--json", env=lab_env).stdout.strip() == "[]"
    plan = cli_here("plan", *asked, "--break-glass", env=lab_env)
    assert plan.returncode == 0, plan.stderr
    assert f"break-glass: {WEAKENED}" in plan.stdout
    assert "approval: 2 approval(s) from group:gpu-leads" in plan.stdout
    done = cli_here("run", *asked, "--break-glass", "--as", "alice", env=lab_env)
    assert done.returncode == 0, done.stderr
    execution_id = done.stdout.split()[1]
    assert "awaiting approval: 2 approval(s)" in done.stdout
    first = cli_here("approve", execution_id, "--as", "carol", env=lab_env)
    assert "(1/2), plan " in first.stdout and "; now awaiting_approval" in first.stdout
    second = cli_here("approve", execution_id, "--as", "dave", env=lab_env)
    assert "(2/2), plan " in second.stdout and "; now approved" in second.stdout
    assert cli_here("engine", "--once", env=lab_env).returncode == 0
    assert journal(lab_env) == ["floor 0"]
    described = cli_here("describe", "floor", env=lab_env).stdout
    assert "a lower value weakens a guard: break-glass" in described


class SilentApi:
    """A Kubernetes API server that accepts connections and never answers (hung): counts
    the connections, so a test sees which commands asked it."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.connections: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:  # closed
                return
            self.connections.append(conn)  # kept open, never answered

    def close(self) -> None:
        self.server.close()
        for conn in self.connections:
            conn.close()


def test_commands_that_need_no_node_list_never_wait_on_a_hung_cluster(
        lab_env: dict[str, str], tmp_path: Path) -> None:
    """The pools are listed when a command first needs them (a plan), not when the bot
    starts: with the Kubernetes API hung, cancel, status, approve... do not ask it."""
    api = SilentApi()
    try:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "hung",
            "clusters": [{"name": "hung", "cluster": {"server": f"http://127.0.0.1:{api.port}"}}],
            "users": [{"name": "bot", "user": {"token": "t"}}],
            "contexts": [{"name": "hung", "context": {"cluster": "hung", "user": "bot"}}]}))
        config = yaml.safe_load(Path(lab_env["RUNBOOK_CONFIG"]).read_text())
        config["kubernetes"] = {"kubeconfig": str(kubeconfig), "request_timeout": 1}
        Path(lab_env["RUNBOOK_CONFIG"]).write_text(yaml.safe_dump(config))

        asked = cli_here("run", "guarded", "node=gpu02", "--as", "alice", env=lab_env)
        assert asked.returncode == 0, asked.stderr
        assert "warning: could not list Kubernetes nodes" in asked.stderr  # a plan lists
        assert "using the configured list" in asked.stderr
        assert "may or may not have been applied" not in asked.stderr  # a read: no change
        execution_id = asked.stdout.split()[1]
        seen = len(api.connections)
        assert seen >= 1
        for args in (["status", execution_id], ["show", execution_id], ["history"],
                     ["list"], ["describe", "guarded"], ["approve", execution_id, "--as",
                                                          "carol"],
                     ["cancel", execution_id, "--as", "alice"]):
            done = cli_here(*args, env=lab_env)
            assert done.returncode == 0, (args, done.stderr)
            assert "could not list" not in done.stderr, args
            assert len(api.connections) == seen, f"runbook {' '.join(args)} asked the API"
        assert "cancelled" in cli_here("status", execution_id, env=lab_env).stdout
    finally:
        api.close()


def test_a_reader_that_stops_early_gets_no_traceback() -> None:
    """`runbook history | head`: the pipe closes under a long listing; exit 0, no traceback."""
    code = ("import bot.surfaces.cli as cli\n"
            "cli._COMMANDS['history'] = lambda args: [print('x' * 99) for _ in range(10**5)] "
            "and 0\n"
            "raise SystemExit(cli.main(['history']))\n")
    listing = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    assert listing.stdout is not None and listing.stdout.readline() == b"x" * 99 + b"\n"
    listing.stdout.close()
    _, err = listing.communicate(timeout=60)
    assert listing.returncode == 0 and b"Traceback" not in err, err.decode()


def test_a_change_reference_is_asked_shown_and_exported(lab_env: dict[str, str]) -> None:
    """policy.require_change for medium risk: `runbook run` refuses a request without a
    reference (exit 2, nothing recorded), `runbook plan` shows it, `runbook audit export
    --change` writes only the events of the executions requested with it."""
    path = Path(lab_env["RUNBOOK_CONFIG"])
    config = yaml.safe_load(path.read_text())
    config["policy"] = {"require_change": True, "change_risks": ["medium"]}
    path.write_text(yaml.safe_dump(config))
    refused = cli_here("run", "guarded", "node=gpu01", "--as", "alice", env=lab_env)
    assert refused.returncode == 2 and "change=REF matching" in refused.stderr
    assert "guarded" not in cli_here("history", env=lab_env).stdout  # nothing recorded
    plan = cli_here("plan", "guarded", "node=gpu01", "change=CHG12345", env=lab_env)
    assert plan.returncode == 0 and "change: CHG12345" in plan.stdout
    ids = []
    for change in ("CHG12345", "INC00001"):
        done = cli_here("run", "guarded", "node=gpu01", f"change={change}", "--as", "alice",
                        env=lab_env)
        assert done.returncode == 0, done.stderr
        ids.append(int(done.stdout.split()[1]))
        cli_here("cancel", str(ids[-1]), "--as", "alice", env=lab_env)  # frees the node lock
    export = cli_here("audit", "export", "--change", "CHG12345", env=lab_env)
    found = [json.loads(line) for line in export.stdout.splitlines()]
    assert found and {e["execution_id"] for e in found} == {ids[0]}
    assert found[0]["data"]["change"] == "CHG12345"
