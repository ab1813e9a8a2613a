"""Slack scopes: the lab's fake grants the shipped app manifest's bot scopes and refuses a
method outside them as Slack does (`missing_scope`, HTTP 200); the manifest grants the scope of
every Web API method the bot calls (found in the code); `runbook serve`'s Slack surface reads
its scopes on auth.test at start and logs the features a missing one turns off, and starts."""

from __future__ import annotations

import importlib
import logging
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from bot.surfaces.slack import scopes
from bot.surfaces.slack.secrets import SlackSecrets
from bot.surfaces.slack.surface import SlackSurface
from tests.conftest import BotFactory

REPO = Path(__file__).resolve().parents[4]
MANIFEST = REPO / "deploy" / "slack-app-manifest.yaml"
BOT_TOKEN = "xoxb-scopes-test-0123456789"
CHANNEL = "C0RUNBOOK"
# slack_sdk's methods the bot might call on its WebClient, as the scan below finds them
CLIENT_CALL = re.compile(r"\.((?:chat|files|users|usergroups|conversations|auth|reactions|pins|"
                         r"views|team|bots|reminders|dnd|emoji|apps)_[A-Za-z0-9_]+)\(")
# slack_sdk helpers that are several Web API methods
COMPOSITE = {"files_upload_v2": ["files.getUploadURLExternal", "files.completeUploadExternal"]}


def fake_scopes() -> Any:
    """The fake's scopes module (deploy/lab/slackapi/scopes.py, stdlib only)."""
    lab = str(REPO / "deploy" / "lab")
    if lab not in sys.path:
        sys.path.insert(0, lab)
    return importlib.import_module("slackapi.scopes")


def without(scope: str, folder: Path) -> Path:
    """The shipped manifest with one bot scope taken out."""
    lines = MANIFEST.read_text().splitlines(keepends=True)
    kept = [line for line in lines if line.split("#")[0].strip() != f"- {scope}"]
    assert len(kept) == len(lines) - 1, f"the manifest grants no {scope}"
    path = folder / f"manifest-without-{scope.replace(':', '-')}.yaml"
    path.write_text("".join(kept))
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def start_fake(tmp_path: Path) -> Iterator[Callable[[Path], str]]:
    """Starts the lab's Slack fake on a free port with the given manifest; its base URL."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(manifest: Path) -> str:
        port = free_port()
        log = tmp_path / f"slack-{port}.log"
        proc = subprocess.Popen(
            [sys.executable, "-m", "slackapi", "--port", str(port), "--bot-token", BOT_TOKEN,
             "--app-token", "xapp-scopes-test-0123456789", "--manifest", str(manifest),
             "--log", str(log)],
            cwd=REPO / "deploy" / "lab", stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 10
        while True:
            try:
                urllib.request.urlopen(f"{url}/_lab/health", timeout=1).read()
                return url
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "no fake"
                time.sleep(0.05)

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)


def client(url: str) -> WebClient:
    return WebClient(token=BOT_TOKEN, base_url=f"{url}/api/", timeout=5)


def test_the_fake_grants_the_manifests_scopes_and_names_them_on_auth_test(
        start_fake: Callable[[Path], str]) -> None:
    granted = fake_scopes().bot_scopes(MANIFEST)
    assert "files:write" in granted and "chat:write" in granted and "commands" in granted
    answer = client(start_fake(MANIFEST)).auth_test()
    assert scopes.granted(dict(answer.headers)) == frozenset(granted)


def test_the_fake_refuses_a_method_outside_the_manifest_as_slack_does(
        start_fake: Callable[[Path], str], tmp_path: Path) -> None:
    web = client(start_fake(without("files:write", tmp_path)))
    root = web.chat_postMessage(channel=CHANNEL, text="execution 7")["ts"]
    with pytest.raises(SlackApiError) as refused:
        web.files_upload_v2(channel=CHANNEL, thread_ts=root, content=b"png",
                            filename="chart.png")
    response = refused.value.response
    assert response.status_code == 200
    assert (response["ok"], response["error"], response["needed"]) == (
        False, "missing_scope", "files:write")
    provided = set(response["provided"].split(","))
    assert provided == set(fake_scopes().bot_scopes(MANIFEST)) - {"files:write"}
    with pytest.raises(SlackApiError) as unscoped:  # granted by no manifest
        web.conversations_history(channel=CHANNEL)
    assert unscoped.value.response["error"] == "missing_scope"
    assert unscoped.value.response["needed"].startswith("channels:history")


def test_with_the_shipped_manifest_the_chart_upload_goes_through(
        start_fake: Callable[[Path], str]) -> None:
    web = client(start_fake(MANIFEST))
    root = web.chat_postMessage(channel=CHANNEL, text="execution 8")["ts"]
    shared = web.files_upload_v2(channel=CHANNEL, thread_ts=root, content=b"\x89PNG",
                                 filename="chart.png")["file"]
    assert shared["name"] == "chart.png"


def bot_methods() -> dict[str, str]:
    """Web API method: where the bot's code calls it (bot/, adapters/, kit/)."""
    found: dict[str, str] = {"auth.test": "Bolt's App (token check) and the scope check"}
    for package in ("bot", "adapters", "kit"):
        for path in sorted((REPO / package).rglob("*.py")):
            for name in CLIENT_CALL.findall(path.read_text()):
                assert hasattr(WebClient, name), f"{path}: {name} is no slack_sdk method"
                for method in COMPOSITE.get(name, [name.replace("_", ".")]):
                    found.setdefault(method, str(path.relative_to(REPO)))
    return found


def test_the_manifest_grants_every_method_the_bot_calls() -> None:
    methods = bot_methods()
    assert {"chat.postMessage", "chat.update", "chat.postEphemeral", "usergroups.users.list",
            "files.getUploadURLExternal", "files.completeUploadExternal"} <= set(methods)
    fake = fake_scopes()
    granted = frozenset(fake.bot_scopes(MANIFEST))
    unknown = {m: where for m, where in methods.items() if m not in fake.NEEDED}
    assert not unknown, f"add these methods' scopes to the fake's scopes.NEEDED: {unknown}"
    lacking = {m: fake.NEEDED[m] for m in methods if fake.missing(m, granted)}
    assert not lacking, f"the app manifest grants none of these methods' scopes: {lacking}"
    needed = {s for m in methods for s in fake.NEEDED[m]}
    assert needed <= set(scopes.FEATURES), "the start-up check does not name these scopes"


def test_every_scope_the_start_up_check_names_is_in_the_manifest() -> None:
    assert set(scopes.FEATURES) <= set(fake_scopes().bot_scopes(MANIFEST))


def secrets_for(url: str) -> SlackSecrets:
    return SlackSecrets(bot_token=BOT_TOKEN, signing_secret="s3cret", app_token=None,
                        api_url=f"{url}/api/", mode="http")


def test_serve_starts_without_files_write_and_says_charts_are_off(
        make_bot: BotFactory, start_fake: Callable[[Path], str], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    bot = make_bot({}, slack={"channel": CHANNEL})
    url = start_fake(without("files:write", tmp_path))
    with caplog.at_level(logging.INFO, logger=scopes.log.name):
        surface = SlackSurface(bot, secrets_for(url))
    assert surface.features_off == {"files:write": scopes.FEATURES["files:write"]}
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith("Slack scope files:write not granted: off: charts in execution "
                              "threads")


def test_serve_with_every_scope_logs_every_feature_on(
        make_bot: BotFactory, start_fake: Callable[[Path], str],
        caplog: pytest.LogCaptureFixture) -> None:
    bot = make_bot({}, slack={"channel": CHANNEL})
    with caplog.at_level(logging.INFO, logger=scopes.log.name):
        surface = SlackSurface(bot, secrets_for(start_fake(MANIFEST)))
    assert surface.features_off == {}
    assert [r.levelno for r in caplog.records if r.name == scopes.log.name] == [logging.INFO]


def test_an_answer_without_the_scopes_header_is_unknown_not_guessed(
        caplog: pytest.LogCaptureFixture) -> None:
    class NoHeader:
        def auth_test(self) -> Any:
            return type("Answer", (), {"headers": {"content-type": "application/json"}})()

    class Down:
        def auth_test(self) -> Any:
            raise OSError("connection refused")

    with caplog.at_level(logging.WARNING, logger=scopes.log.name):
        assert scopes.check(NoHeader()) is None
        assert scopes.check(Down()) is None
    assert [r.getMessage() for r in caplog.records] == [
        "Slack did not name the token's scopes (no x-oauth-scopes header on auth.test)",
        "cannot read the Slack token's scopes (auth.test: connection refused)"]
    assert scopes.granted({"X-OAuth-Scopes": "chat:write, commands"}) == frozenset(
        {"chat:write", "commands"})
    assert scopes.features_off(frozenset(scopes.FEATURES)) == {}
