"""Who may POST /alerts (bot.runtime.access): the bearer token from RUNBOOK_ALERTS_TOKEN or
server.alerts_token_file (never the configuration file itself), `runbook serve` refusing to
start (exit 2) when /alerts would be open on a non-loopback address and warning once when it
is open on loopback, and server.alerts_auth: none."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from bot.config import ConfigError, ServerConfig, load_config
from bot.runtime import access
from bot.runtime.access import AlertsAuthError, alerts_access
from bot.store import db
from tests.processes import FAULTHANDLER, stopped

TOKEN = "0123456789abcdef0123456789abcdef"
RUNBOOK = [sys.executable, "-m", "bot"]


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("[::1]", True),
    ("localhost", True), ("0.0.0.0", False), ("", False), ("::", False), ("10.0.0.5", False),
    ("bot.example.com", False)])
def test_what_counts_as_loopback(host: str, loopback: bool) -> None:
    assert access.is_loopback(host) is loopback


def test_the_token_comes_from_the_environment_or_its_file(tmp_path: Path) -> None:
    assert alerts_access(ServerConfig(), "0.0.0.0", {access.TOKEN_ENV: TOKEN}).token == TOKEN
    file = tmp_path / "alerts-token"
    file.write_text(f"{TOKEN}\n")  # whitespace around it is dropped, as Alertmanager does
    server = ServerConfig(alerts_token_file=file)
    assert alerts_access(server, "0.0.0.0", {}).token == TOKEN
    other = "f" * 32
    assert alerts_access(server, "0.0.0.0", {access.TOKEN_ENV: other}).token == other
    assert TOKEN not in repr(alerts_access(server, "0.0.0.0", {}))


@pytest.mark.parametrize(("content", "message"), [
    (None, "cannot read server.alerts_token_file"), ("  \n", "is empty"),
    ("short", "at least 16 characters"), ("a token with spaces in it", "holds 6 tokens"),
    (f"{TOKEN} short", "at least 16 characters"), (f"{TOKEN}\n{TOKEN}é", "at least 16")])
def test_a_token_file_that_will_not_do_stops_the_start(tmp_path: Path, content: str | None,
                                                       message: str) -> None:
    file = tmp_path / "alerts-token"
    if content is not None:
        file.write_text(content)
    with pytest.raises(AlertsAuthError, match=message) as raised:
        alerts_access(ServerConfig(alerts_token_file=file), "127.0.0.1", {})
    if content and content.strip():
        assert content.strip() not in str(raised.value)


def test_two_tokens_while_rotating_are_both_taken(tmp_path: Path) -> None:
    new = "n" * 16 + "-new-token"
    file = tmp_path / "alerts-token"
    file.write_text(f"{TOKEN}\n{new}\n")
    taken = alerts_access(ServerConfig(alerts_token_file=file), "0.0.0.0", {})
    assert taken.tokens == (TOKEN, new) and taken.token == TOKEN
    for token in (TOKEN, new):
        assert access.bearer_problem({"authorization": f"Bearer {token}"}, taken.tokens) is None
    assert access.bearer_problem({"authorization": f"Bearer {TOKEN}{new}"},
                                 taken.tokens) is not None
    assert alerts_access(ServerConfig(), "::", {access.TOKEN_ENV: f" {new} {TOKEN} "}
                         ).tokens == (new, TOKEN)


def test_no_token_is_refused_off_loopback_and_warned_about_on_it() -> None:
    with pytest.raises(AlertsAuthError, match="set RUNBOOK_ALERTS_TOKEN"):
        alerts_access(ServerConfig(), "0.0.0.0", {})
    with pytest.raises(AlertsAuthError, match="every address"):
        alerts_access(ServerConfig(), "", {})
    local = alerts_access(ServerConfig(), "127.0.0.1", {})
    assert local.token is None and "not authenticated" in (local.warning or "")


def test_alerts_auth_none_opens_it_on_purpose() -> None:
    server = ServerConfig(alerts_auth="none")
    opened = alerts_access(server, "0.0.0.0", {})
    assert opened.token is None and "server.alerts_auth: none" in (opened.warning or "")
    with pytest.raises(AlertsAuthError, match="alerts_auth is none but RUNBOOK_ALERTS_TOKEN"):
        alerts_access(server, "0.0.0.0", {access.TOKEN_ENV: TOKEN})


@pytest.mark.parametrize("text", ["server:\n  alerts_token: x\n", "server:\n  token: x\n",
                                  "server:\n  alerts_auth: none\n  alerts_token_file: t\n",
                                  "server:\n  alerts_auth: basic\n"])
def test_the_configuration_file_never_holds_the_token(tmp_path: Path, text: str) -> None:
    (tmp_path / "bot.yaml").write_text(text)
    with pytest.raises(ConfigError, match="alerts_"):
        load_config(tmp_path / "bot.yaml")


def test_the_token_file_is_relative_to_the_configuration(tmp_path: Path) -> None:
    (tmp_path / "bot.yaml").write_text("server:\n  alerts_token_file: secrets/alerts\n")
    config = load_config(tmp_path / "bot.yaml")
    assert config.server.alerts_token_file == tmp_path / "secrets" / "alerts"
    assert config.server.alerts_auth == "bearer" and config.server.alert_refire_seconds == 300


def test_bearer_problem_compares_the_header() -> None:
    assert access.bearer_problem({"authorization": f"Bearer {TOKEN}"}, TOKEN) is None
    assert access.bearer_problem({"authorization": f"BEARER  {TOKEN} "}, TOKEN) is None
    for headers in ({}, {"authorization": TOKEN}, {"authorization": f"Basic {TOKEN}"},
                    {"authorization": "Bearer ünïcode-is-not-it"},
                    {"authorization": f"Bearer {TOKEN[:-1]}"}):
        problem = access.bearer_problem(headers, TOKEN)
        assert problem is not None and TOKEN[:6] not in problem, headers


# --- runbook serve ------------------------------------------------------------------------------

def bare_serve_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The defaults under a temporary state folder, with no database yet."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}
    env.update(XDG_STATE_HOME=str(tmp_path / "state"), **FAULTHANDLER, **extra)
    return env


def serve_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The defaults, their database made first, as a site runs `runbook db init` before
    `runbook serve` (which never creates one)."""
    (tmp_path / "state" / "gpu-runbook-bot").mkdir(parents=True)
    db.init(f"sqlite:///{tmp_path / 'state' / 'gpu-runbook-bot' / 'bot.db'}")
    return bare_serve_env(tmp_path, **extra)


def test_serve_refuses_an_unauthenticated_alerts_off_loopback(tmp_path: Path) -> None:
    done = subprocess.run([*RUNBOOK, "serve", "--host", "0.0.0.0", "--port", str(free_port())],
                          env=bare_serve_env(tmp_path), capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "set RUNBOOK_ALERTS_TOKEN (or server.alerts_token_file)" in done.stderr
    assert "server.alerts_auth: none" in done.stderr
    assert not (tmp_path / "state").exists()  # refused before the database was opened


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def post_alerts(port: int, authorization: str | None) -> int:
    headers = {"Authorization": authorization} if authorization else {}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/alerts", method="POST",
                                     data=b'{"version": "4", "status": "firing", "alerts": []}',
                                     headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        exc.close()  # it holds the response and its socket
        return exc.code


def serve_until_up(port: int, env: dict[str, str]) -> subprocess.Popen[str]:
    """`runbook serve` on loopback, once /alerts answers (the caller stops it)."""
    server = subprocess.Popen([*RUNBOOK, "serve", "--port", str(port)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            post_alerts(port, None)
            return server
        except OSError:
            assert server.poll() is None, server.communicate()
            assert time.monotonic() < deadline, "runbook serve did not answer"
            time.sleep(0.1)


@pytest.mark.parametrize("token", [None, TOKEN])
def test_serve_on_loopback(tmp_path: Path, token: str | None) -> None:
    """Without a token: served without authentication, said once on stderr. With one: 401
    without it, and the token is printed nowhere."""
    port = free_port()
    env = serve_env(tmp_path, **({access.TOKEN_ENV: token} if token else {}))
    server = serve_until_up(port, env)
    try:
        unauthenticated = post_alerts(port, None)
        authenticated = post_alerts(port, f"Bearer {TOKEN}")
    finally:
        out, err = stopped(server)
    warnings = [line for line in err.splitlines() if "/alerts is not authenticated" in line]
    if token is None:
        assert (unauthenticated, authenticated) == (200, 200)
        assert len(warnings) == 1 and warnings[0].startswith("warning: "), err
    else:
        assert (unauthenticated, authenticated) == (401, 200)
        assert warnings == [] and TOKEN not in out + err


def test_serve_on_a_port_in_use_exits_2_saying_so(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([*RUNBOOK, "serve", "--port", str(port)],
                              env=serve_env(tmp_path), capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in done.stderr
    assert "Traceback" not in done.stderr
