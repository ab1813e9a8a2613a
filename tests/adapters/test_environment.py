"""Invariant 8: secrets never reach the environment (nor argv) of anything the bot starts.

The bot's environment holds Slack tokens, the database URL, PGPASSWORD and cloud keys.
These tests put such secrets into the test process's environment (the bot's, as far as
the adapters can tell) and run real programs through every kind of call site: host
commands and command checks, Slurm clients, srun (on the lab's nodes too), the MariaDB
tools and etcdctl.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from adapters.actions import ActionContext, ActionError
from adapters.environment import NODE_EXPORT, child_environment, node_export
from adapters.etcd.backend import EtcdCommands, EtcdctlBackend, EtcdError
from adapters.etcd.config import EtcdConfig
from adapters.host import HostCommand, HostRunAction, HostRunArguments, run_check_command
from adapters.mariadb import (
    DumpAction,
    DumpArguments,
    MariaDBConfig,
    RestoreAction,
    RestoreArguments,
    option_file_text,
)
from adapters.slurm.actions import RunOnNodeArguments, SlurmActions
from adapters.slurm.config import SlurmConfig
from adapters.slurm.transports.cli import CliBackend
from tests.lab.fixture import Lab

SECRETS = {
    "SLACK_BOT_TOKEN": "xoxb-secret-bot-token",
    "SLACK_SIGNING_SECRET": "secret-signing-secret",
    "PGPASSWORD": "secret-pg-password",
    "RUNBOOK_DB_URL": "postgresql://bot:secret-db-password@db/bot",
    "AWS_SECRET_ACCESS_KEY": "secret-aws-key",
    "SLURM_JWT": "secret-slurm-jwt",
    "ETCDCTL_PASSWORD": "secret-etcd-password",
}


@pytest.fixture
def secrets_in_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LC_TIME", "C.UTF-8")
    return SECRETS


def context(seconds: float = 60) -> ActionContext:
    return ActionContext(execution_id=1, step_id="s", deadline=time.monotonic() + seconds,
                         progress=lambda line: None)


def parse_env(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def assert_no_secret(text: str) -> None:
    for name, value in SECRETS.items():
        assert name not in text and value not in text, f"{name} reached a child"


def test_child_environment_keeps_only_the_allow_list() -> None:
    base = {**SECRETS, "PATH": "/usr/bin", "HOME": "/home/bot", "LANG": "C.UTF-8",
            "LC_TIME": "C", "TZ": "UTC", "SLURM_CONF": "/etc/slurm/slurm.conf",
            "KUBERNETES_SERVICE_HOST": "10.0.0.1", "PYTHONPATH": "/x", "LD_PRELOAD": "/y.so"}
    env = child_environment({"GRB_SETTING": "1"}, base=base)
    assert env == {"PATH": "/usr/bin", "HOME": "/home/bot", "LANG": "C.UTF-8", "LC_TIME": "C",
                   "TZ": "UTC", "SLURM_CONF": "/etc/slurm/slurm.conf", "GRB_SETTING": "1"}
    # What the adapter or the configuration sets wins over the bot's own value.
    assert child_environment({"PATH": "/opt/bin"}, base=base)["PATH"] == "/opt/bin"
    assert child_environment(base={}) == {}


def test_child_environment_reads_the_bot_environment(secrets_in_env: dict[str, str]) -> None:
    env = child_environment()
    assert not set(SECRETS) & set(env)
    assert env["PATH"] == os.environ["PATH"] and env["LC_TIME"] == "C.UTF-8"


def test_node_export_lists_names_only() -> None:
    assert node_export() == ",".join(NODE_EXPORT)
    assert node_export(["ZED", "ALPHA", "PATH"]) == ",".join([*NODE_EXPORT, "ALPHA", "ZED"])


@pytest.mark.parametrize(("env", "error"), [
    ({"1ABC": "x"}, "not a variable name"),
    ({"A-B": "x"}, "not a variable name"),
    ({"A=B": "x"}, "not a variable name"),
    ({"": "x"}, "not a variable name"),
    ({"A": "x\0y"}, "NUL byte"),
    ({"A": 1}, "valid string"),
])
def test_env_of_a_command_is_validated(env: dict[str, Any], error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        HostCommand.model_validate({"argv": ["true"], "env": env})
    with pytest.raises(ValidationError, match=error):
        SlurmConfig.model_validate({"commands": {"c": {"argv": ["true"], "env": env}}})


def test_host_command_gets_a_clean_environment(secrets_in_env: dict[str, str]) -> None:
    action = HostRunAction({
        "show-env": HostCommand(argv=["env"], env={"GRB_SETTING": "a value"}),
        "plain-env": HostCommand(argv=["env"]),
    })
    args = HostRunArguments(command="show-env")
    result = action.run(args, context())
    assert_no_secret(result.details["stdout"])
    seen = parse_env(result.details["stdout"])
    assert seen["PATH"] == os.environ["PATH"]
    assert seen["LC_TIME"] == "C.UTF-8" and seen["GRB_SETTING"] == "a value"
    assert action.plan(args) == ["run on the bot host: env (environment sets GRB_SETTING)"]
    plain = action.run(HostRunArguments(command="plain-env"), context()).details["stdout"]
    assert_no_secret(plain)
    assert "GRB_SETTING" not in plain and "PATH=" in plain


def test_check_command_gets_a_clean_environment(secrets_in_env: dict[str, str]) -> None:
    code, output = run_check_command(HostCommand(argv=["env"], env={"GRB_CHECK": "1"}), 10)
    assert code == 0
    assert_no_secret(output)
    assert parse_env(output)["GRB_CHECK"] == "1" and "PATH=" in output


def recording_tool(folder: Path, name: str, record: Path) -> None:
    """An executable NAME in FOLDER that writes its argv, environment and the option file
    a --defaults-extra-file names (content, modes) to RECORD as JSON."""
    script = folder / name
    script.write_text(f"""#!{sys.executable}
import json, os, stat, sys
options = {{}}
for arg in sys.argv[1:]:
    if arg.startswith("--defaults-extra-file="):
        path = arg.split("=", 1)[1]
        options = {{"text": open(path).read(),
                    "mode": stat.S_IMODE(os.stat(path).st_mode),
                    "folder_mode": stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode),
                    "path": path}}
with open({str(record)!r}, "w") as out:
    json.dump({{"argv": sys.argv, "env": dict(os.environ), "options": options}}, out)
""")
    script.chmod(0o755)


def read_record(record: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(record.read_text())
    return data


def test_slurm_clients_get_a_clean_environment(
        secrets_in_env: dict[str, str], tmp_path: Path) -> None:
    record = tmp_path / "record.json"
    recording_tool(tmp_path, "scontrol", record)
    backend = CliBackend(SlurmConfig(bin_dir=str(tmp_path), slurm_conf="/etc/site/slurm.conf"))
    backend.run(["scontrol", "ping"])
    seen = read_record(record)
    assert not set(SECRETS) & set(seen["env"])
    assert_no_secret(json.dumps(seen))
    assert seen["env"]["SLURM_CONF"] == "/etc/site/slurm.conf"
    assert seen["env"]["PATH"] == os.environ["PATH"]


def test_srun_exports_only_allowed_names(secrets_in_env: dict[str, str], tmp_path: Path) -> None:
    record = tmp_path / "record.json"
    recording_tool(tmp_path, "srun", record)
    config = SlurmConfig.model_validate({
        "bin_dir": str(tmp_path),
        "commands": {"probe": {"argv": ["probe"], "env": {"GRB_NODE_SETTING": "on"}}}})
    backend = CliBackend(config)
    code, _, _ = backend.run_on_node("gpu01", "maint", ["probe"], 10, {"GRB_NODE_SETTING": "on"})
    assert code == 0
    seen = read_record(record)
    exports = [arg for arg in seen["argv"] if arg.startswith("--export=")]
    assert exports == [f"--export={','.join(NODE_EXPORT)},GRB_NODE_SETTING"]
    assert seen["argv"].index(exports[0]) < seen["argv"].index("--")
    assert not set(SECRETS) & set(seen["env"])
    assert seen["env"]["GRB_NODE_SETTING"] == "on"  # srun exports it by name: value not in argv
    assert "on" not in seen["argv"]
    # Through the action: the plan shows the same --export list, and the command's env
    # reaches srun.
    action = SlurmActions(_FakeNodes(backend), config).by_name()["slurm.run_on_node"]
    args = RunOnNodeArguments(node="gpu01", command="probe")
    assert f"--export={','.join(NODE_EXPORT)},GRB_NODE_SETTING" in action.plan(args)[0]
    record.unlink()
    action.run(args, context())
    assert read_record(record)["env"]["GRB_NODE_SETTING"] == "on"


class _FakeNodes:
    """Answers the reads of slurm.run_on_node; run_on_node goes to the real CLI backend."""

    def __init__(self, backend: CliBackend) -> None:
        self._backend = backend

    def nodes(self, names: list[str] | None = None, *, with_jobs: bool = True) -> list[Any]:
        from adapters.slurm.backend import NodeInfo
        return [NodeInfo(name=n, state="idle", gpus_total=8) for n in names or []]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


TRICKY = 'pa ss#w"o\\rd\'x;$(id)`\n\t=end'


def test_mariadb_password_goes_in_a_private_option_file(
        secrets_in_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRB_TEST_DB_PASSWORD", TRICKY)
    record = tmp_path / "record.json"
    recording_tool(tmp_path, "fake-mariadb", record)
    config = MariaDBConfig(socket="/run/mysqld/mysqld.sock", password_env="GRB_TEST_DB_PASSWORD",
                           client_command=str(tmp_path / "fake-mariadb"))
    backup = tmp_path / "backup.sql"
    backup.write_text("-- nothing\n")
    action = RestoreAction(config)
    action.run(RestoreArguments(database="slurm_acct_db", path=str(backup)), context())
    seen = read_record(record)
    assert seen["argv"][1].startswith("--defaults-extra-file=")  # must be the first option
    assert seen["argv"][2:] == ["--socket=/run/mysqld/mysqld.sock", "--user=root",
                                "slurm_acct_db"]
    assert TRICKY not in json.dumps(seen["argv"])
    assert "MYSQL_PWD" not in seen["env"] and TRICKY not in json.dumps(seen["env"])
    assert "GRB_TEST_DB_PASSWORD" not in seen["env"]
    assert not set(SECRETS) & set(seen["env"])
    assert seen["options"]["text"] == option_file_text(TRICKY)
    assert seen["options"]["mode"] == 0o600 and seen["options"]["folder_mode"] == 0o700
    assert not Path(seen["options"]["path"]).exists()  # removed when the tool ended
    # No password configured: no option file at all.
    record.unlink()
    plain = RestoreAction(config.model_copy(update={"password_env": None}))
    plain.run(RestoreArguments(database="slurm_acct_db", path=str(backup)), context())
    assert read_record(record)["argv"][1] == "--socket=/run/mysqld/mysqld.sock"


def test_mariadb_password_variable_missing_is_an_error(tmp_path: Path) -> None:
    config = MariaDBConfig(password_env="GRB_TEST_NO_SUCH_VARIABLE",
                           dump_command=str(tmp_path / "never-run"), backup_dir=str(tmp_path))
    action = DumpAction(config)
    with pytest.raises(ActionError, match="GRB_TEST_NO_SUCH_VARIABLE, which is not set"):
        action.run(DumpArguments(database="db", path=str(tmp_path / "d.sql")), context())


@pytest.mark.parametrize("password", [TRICKY, "plain", "", "back\\slash\\", '"quoted"',
                                      "'single'", "#hash", " spaced "])
def test_option_file_reads_back_as_the_password(password: str, tmp_path: Path) -> None:
    tool = shutil.which("my_print_defaults")
    if tool is None:
        pytest.skip("my_print_defaults (mariadb-client) is not installed")
    options = tmp_path / "client.cnf"
    options.write_text(option_file_text(password))
    options.chmod(0o600)
    done = subprocess.run([tool, f"--defaults-file={options}", "client"], capture_output=True,
                          text=True, check=True, timeout=10, env=child_environment())
    # my_print_defaults prints one option per line; the password may hold a newline.
    assert done.stdout == f"--password={password}\n"


def test_etcdctl_gets_a_clean_environment_and_its_credentials_by_variable(
        secrets_in_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ETCDCTL_ENDPOINTS", "http://elsewhere:2379")
    monkeypatch.setenv("ETCDCTL_USER", "operator")
    commands = EtcdCommands(EtcdConfig(endpoints=["http://e:2379"]))
    env = commands.env(commands.health())
    assert env["ETCDCTL_API"] == "3"
    assert not {"ETCDCTL_ENDPOINTS", "ETCDCTL_USER", "ETCDCTL_PASSWORD"} & set(env)
    assert not set(SECRETS) & set(env)

    monkeypatch.setenv("GRB_TEST_ETCD_PASSWORD", "etcd pass:word")
    commands = EtcdCommands(EtcdConfig(endpoints=["http://e:2379"], user="root",
                                       password_env="GRB_TEST_ETCD_PASSWORD"),
                            which=lambda name: None)
    for argv in (commands.health(), commands.get("/a"), commands.count(""),
                 commands.snapshot_save("/tmp/s.db")):
        env = commands.env(argv)
        assert env["ETCDCTL_USER"] == "root" and env["ETCDCTL_PASSWORD"] == "etcd pass:word"
        assert "etcd pass:word" not in " ".join(argv) and "GRB_TEST_ETCD_PASSWORD" not in env
    # Offline tools talk to no etcd: no credentials.
    assert "ETCDCTL_PASSWORD" not in commands.env(commands.snapshot_status("/tmp/s.db"))
    monkeypatch.delenv("GRB_TEST_ETCD_PASSWORD")
    with pytest.raises(EtcdError, match="GRB_TEST_ETCD_PASSWORD, which is not set"):
        commands.env(commands.health())


def test_etcd_user_needs_password_env() -> None:
    with pytest.raises(ValidationError, match="go together"):
        EtcdConfig(endpoints=["http://e:2379"], user="root")
    with pytest.raises(ValidationError, match="go together"):
        EtcdConfig(endpoints=["http://e:2379"], password_env="X")


# --- on the lab's real Slurm and MariaDB -------------------------------------------------

@pytest.mark.lab
def test_lab_srun_job_step_sees_no_secret(lab: Lab, secrets_in_env: dict[str, str]) -> None:
    config = SlurmConfig.model_validate({
        "slurm_conf": lab["slurm_conf"],
        "commands": {"show-env": {"argv": ["env"], "env": {"GRB_NODE_SETTING": "on"}}}})
    backend = CliBackend(config)
    node = lab["slurmd_nodes"][0]
    code, out, err = backend.run_on_node(node, None, ["env"], 60, {"GRB_NODE_SETTING": "on"})
    assert code == 0, err
    assert_no_secret(out)
    seen = parse_env(out)
    assert seen["SLURMD_NODENAME"] == node  # it did run in a job step on the node
    assert seen["PATH"] == os.environ["PATH"] and seen["GRB_NODE_SETTING"] == "on"
    assert "LC_TIME" not in seen  # exported only by name from NODE_EXPORT and env:
    # The same through the action, as a runbook step runs it.
    action = SlurmActions(backend, config).by_name()["slurm.run_on_node"]
    result = action.run(RunOnNodeArguments(node=node, command="show-env"), context(120))
    assert_no_secret(result.details["stdout"])
    assert parse_env(result.details["stdout"])["GRB_NODE_SETTING"] == "on"


@pytest.mark.lab
def test_lab_mariadb_dump_authenticates_through_the_option_file(
        lab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    maria = lab["mariadb"]
    config = MariaDBConfig(host=maria["host"], port=maria["port"], user=maria["user"],
                           password_env="GRB_TEST_DB_PASSWORD", timeout=120,
                           backup_dir=str(tmp_path))
    action = DumpAction(config)
    args = DumpArguments(database=maria["database"], path=str(tmp_path / "dump.sql"))
    monkeypatch.setenv("GRB_TEST_DB_PASSWORD", "wrong-" + maria["password"])
    with pytest.raises(ActionError, match="Access denied"):
        action.run(args, context(120))
    monkeypatch.setenv("GRB_TEST_DB_PASSWORD", maria["password"])
    result = action.run(args, context(120))
    assert result.details["bytes"] > 0
    assert "CREATE TABLE" in (tmp_path / "dump.sql").read_text()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
def etcd_with_auth(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A private etcd (not the lab's: auth would lock the others out) with auth on;
    yields (endpoint, root password)."""
    server, client = shutil.which("etcd"), shutil.which("etcdctl")
    if server is None or client is None:
        pytest.skip("etcd and etcdctl (Debian: etcd-server, etcd-client) are not installed")
    endpoint, peer = f"http://127.0.0.1:{_free_port()}", f"http://127.0.0.1:{_free_port()}"
    log = open(tmp_path / "etcd.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [server, "--name", "auth-test", "--data-dir", str(tmp_path / "data"),
         "--listen-client-urls", endpoint, "--advertise-client-urls", endpoint,
         "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
         "--initial-cluster", f"auth-test={peer}"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=child_environment())
    password = 'pw with "quotes", a colon: and $(id)'
    env = child_environment({"ETCDCTL_API": "3"})

    def etcdctl(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([client, f"--endpoints={endpoint}", *args], env={**env, **extra},
                              capture_output=True, text=True, timeout=20, check=False)

    try:
        deadline = time.monotonic() + 20
        while etcdctl("endpoint", "health").returncode != 0:
            assert time.monotonic() < deadline, (tmp_path / "etcd.log").read_text()[-2000:]
            time.sleep(0.2)
        added = etcdctl("user", "add", "root", "--new-user-password", password)
        assert added.returncode == 0, added.stderr
        assert etcdctl("auth", "enable").returncode == 0
        assert etcdctl("put", "/k", "v", ETCDCTL_USER="root",
                       ETCDCTL_PASSWORD=password).returncode == 0
        yield endpoint, password
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


def test_etcdctl_authenticates_with_the_configured_user(
        etcd_with_auth: tuple[str, str], secrets_in_env: dict[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint, password = etcd_with_auth
    monkeypatch.setenv("ETCDCTL_USER", f"root:{password}")  # an operator's: never used
    anonymous = EtcdctlBackend(EtcdConfig(endpoints=[endpoint]))
    with pytest.raises(EtcdError, match="user name is empty"):
        anonymous.key_count("/")
    monkeypatch.setenv("GRB_TEST_ETCD_PASSWORD", password)
    backend = EtcdctlBackend(EtcdConfig(endpoints=[endpoint], user="root",
                                        password_env="GRB_TEST_ETCD_PASSWORD"))
    assert backend.key_count("/") == 1 and backend.get("/k") == "v"
    assert backend.health()[endpoint].healthy
