"""The lab's Slack fake with slack_sdk's own clients: WebClient (auth, messages, threads,
updates, errors, a 429 retried by RateLimitErrorRetryHandler), the builtin Socket Mode client
(hello, an envelope, the ack), and the signed requests of labkit/slackclient.py checked with
slack_sdk's SignatureVerifier."""
from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import re
import socket
import struct
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar
from urllib.parse import parse_qs

import pytest

from tests.lab.fixture import REPO, Lab

pytest.importorskip("slack_sdk", reason="slack_sdk is not installed")
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_handlers import RateLimitErrorRetryHandler
from slack_sdk.signature import SignatureVerifier
from slack_sdk.socket_mode.builtin import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse

sys.path.insert(0, str(REPO / "deploy" / "lab"))
from labkit import slackclient

pytestmark = pytest.mark.lab
TS = re.compile(r"^\d{10}\.\d{6}$")


@pytest.fixture
def slack(lab: Lab) -> Iterator[slackclient.LabSlack]:
    """The lab's Slack, emptied: no calls, messages, acks or faults from earlier tests."""
    sl = slackclient.LabSlack.from_info(lab.info)
    slackclient.reset(sl.url)
    yield sl
    slackclient.clear_faults(sl.url)


def web(sl: slackclient.LabSlack, token: str | None = None, **kwargs: Any) -> WebClient:
    return WebClient(token=sl.bot_token if token is None else token, base_url=sl.api_url,
                     timeout=10, **kwargs)


def wait_for(what: Callable[[], Any], message: str, timeout: float = 10) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {message}")


def test_env_exports_slack_but_not_the_app_token(lab: Lab) -> None:
    out = lab.lab("env").stdout
    for name in ("SLACK_API_URL", "SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET",
                 "LAB_SLACK_APP_TOKEN"):
        assert f"export {name}=" in out
    assert "export SLACK_APP_TOKEN=" not in out
    assert lab.env["SLACK_API_URL"].endswith("/api/")
    assert lab["slack"]["channel"] == "C0RUNBOOK"
    assert oct((lab.dir / "etc" / "slack.json").stat().st_mode & 0o777) == "0o600"


def test_auth_test_and_bad_tokens(slack: slackclient.LabSlack) -> None:
    me = web(slack).auth_test()
    assert (me["user_id"], me["team_id"], me["bot_id"]) == ("U0BOT", "T0LAB", "B0BOT")
    assert me["url"] == "https://grblab.slack.com/"
    with pytest.raises(SlackApiError) as wrong:
        web(slack, token="xoxb-not-the-lab-token").auth_test()
    assert wrong.value.response["error"] == "invalid_auth"
    assert wrong.value.response.status_code == 200
    with pytest.raises(SlackApiError) as app_token:
        web(slack, token=slack.app_token).auth_test()
    assert app_token.value.response["error"] == "not_allowed_token_type"
    with pytest.raises(SlackApiError) as missing:
        web(slack, token="").api_call("chat.postMessage", json={"channel": "C0RUNBOOK"})
    assert missing.value.response["error"] == "not_authed"
    calls = slackclient.calls(slack.url, "auth.test")
    assert [c["token"] for c in calls] == ["bot", "invalid", "app"]
    assert [c["token_valid"] for c in calls] == [True, False, True]


def test_post_thread_update_and_the_channel(slack: slackclient.LabSlack) -> None:
    client = web(slack)
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": "*drain gpu03*"}},
        {"type": "actions", "elements": [
            {"type": "button", "action_id": "approve", "value": "7", "style": "primary",
             "text": {"type": "plain_text", "text": "Approve"}}]}]
    posted = client.chat_postMessage(channel="C0RUNBOOK", text="drain gpu03", blocks=blocks)
    assert posted["channel"] == "C0RUNBOOK" and TS.match(posted["ts"])
    assert posted["message"]["bot_id"] == "B0BOT" and posted["message"]["user"] == "U0BOT"
    assert all("block_id" in b for b in posted["message"]["blocks"])  # added, as Slack does
    reply = client.chat_postMessage(channel="C0RUNBOOK", text="queued", thread_ts=posted["ts"])
    assert reply["message"]["thread_ts"] == posted["ts"] and reply["ts"] > posted["ts"]
    # Text only: Slack keeps the blocks; blocks=[] removes them.
    client.chat_update(channel="C0RUNBOOK", ts=posted["ts"], text="drain gpu03: approved")
    view = slackclient.messages(slack.url)
    assert view["messages"][0]["text"] == "drain gpu03: approved"
    assert view["messages"][0]["blocks"][1]["elements"][0]["action_id"] == "approve"
    updated = client.chat_update(channel="C0RUNBOOK", ts=posted["ts"], text="done", blocks=[])
    assert updated["ts"] == posted["ts"] and updated["text"] == "done"
    (top,) = slackclient.messages(slack.url)["messages"]
    assert top["text"] == "done" and "blocks" not in top and top["updates"] == 2
    assert [r["text"] for r in top["replies"]] == ["queued"]
    link = client.chat_getPermalink(channel="C0RUNBOOK", message_ts=reply["ts"])["permalink"]
    assert link.endswith(f"?thread_ts={posted['ts']}&cid=C0RUNBOOK")
    assert client.usergroups_users_list(usergroup="S0GPULEADS")["users"] == ["U0CAROL", "U0DAVE"]
    assert client.users_info(user="U0ALICE")["user"]["name"] == "alice"
    with pytest.raises(SlackApiError) as unscoped:  # the app manifest grants no channels:read
        client.conversations_info(channel="C0RUNBOOK")
    assert unscoped.value.response["error"] == "missing_scope"
    assert TS.match(client.chat_postEphemeral(channel="C0RUNBOOK", user="U0BOB",
                                              text="only you")["message_ts"])
    update_call = slackclient.calls(slack.url, "chat.update")[-1]
    assert update_call["args"]["blocks"] == [] and update_call["transport"] == "json"


def test_errors_as_slack_answers_them(slack: slackclient.LabSlack) -> None:
    client = web(slack)

    def error(call: Callable[[], Any]) -> tuple[str, Any]:
        with pytest.raises(SlackApiError) as failed:
            call()
        return failed.value.response["error"], failed.value.response.get("response_metadata")

    assert error(lambda: client.chat_update(channel="C0RUNBOOK", ts="1700000000.000100",
                                            text="x"))[0] == "message_not_found"
    assert error(lambda: client.chat_postMessage(channel="C0NOPE", text="x"))[0] \
        == "channel_not_found"
    assert error(lambda: client.chat_postMessage(channel="C0GENERAL", text="x"))[0] \
        == "not_in_channel"
    missing = error(lambda: client.api_call("chat.postMessage", json={"text": "x"}))
    assert missing == ("invalid_arguments",
                       {"messages": ["[ERROR] missing required field: channel"]})
    assert error(lambda: client.usergroups_users_list(usergroup="S0NOPE"))[0] \
        == "no_such_subteam"
    too_long = [{"type": "section", "text": {"type": "mrkdwn", "text": "x" * 3001}}]
    code, meta = error(lambda: client.chat_postMessage(channel="C0RUNBOOK", text="x",
                                                       blocks=too_long))
    assert code == "invalid_blocks"
    assert meta["messages"] == [
        "[ERROR] must be less than 3001 characters [json-pointer:/blocks/0/text/text]"]
    assert error(lambda: client.api_call("no.such.method"))[0] == "unknown_method"


def test_ratelimit_is_retried_by_slack_sdk(slack: slackclient.LabSlack) -> None:
    slackclient.arm_fault(slack.url, ratelimit=1, retry_after=0, method="chat.postMessage")
    client = web(slack, retry_handlers=[RateLimitErrorRetryHandler(max_retry_count=2)])
    posted = client.chat_postMessage(channel="C0RUNBOOK", text="after a 429")
    calls = slackclient.calls(slack.url, "chat.postMessage")
    assert [(c["status"], c["error"]) for c in calls] == [(429, "ratelimited"), (200, None)]
    assert calls[0]["args"] == calls[1]["args"]
    assert [m["ts"] for m in slackclient.messages(slack.url)["messages"]] == [posted["ts"]]
    # Without the handler the 429 reaches the caller, with Retry-After.
    slackclient.arm_fault(slack.url, ratelimit=1, retry_after=7)
    with pytest.raises(SlackApiError) as limited:
        web(slack).chat_postMessage(channel="C0RUNBOOK", text="x")
    assert limited.value.response.status_code == 429
    assert limited.value.response.headers["Retry-After"] == "7"


def test_the_calls_log_never_holds_a_token(lab: Lab, slack: slackclient.LabSlack) -> None:
    wrong = "xoxb-wrong-token-123456"
    web(slack).auth_test()
    web(slack).chat_postMessage(channel="C0RUNBOOK", text=f"echo {slack.bot_token}")
    with pytest.raises(SlackApiError):
        web(slack, token=wrong).auth_test()
    form = urllib.request.Request(f"{slack.api_url}auth.test",
                                  data=f"token={slack.bot_token}".encode(), method="POST")
    with urllib.request.urlopen(form, timeout=10) as answer:
        assert json.load(answer)["ok"] is True  # a token form field works, as in Slack
    urllib.request.urlopen(f"{slack.api_url}auth.test?token={wrong}", timeout=10).close()
    raw = urllib.request.urlopen(f"{slack.url}/_lab/calls", timeout=10).read().decode()
    log = (lab.dir / "log" / "slack.log").read_text()
    for secret in (slack.bot_token, slack.app_token, wrong):
        assert secret not in raw and secret not in log
    calls = json.loads(raw)
    assert [c["token"] for c in calls] == ["bot", "bot", "invalid", "bot", "invalid"]
    assert all("token" not in c["args"] for c in calls)
    assert calls[1]["args"]["text"] == "[redacted]"


def test_socket_mode_round_trip_with_the_builtin_client(slack: slackclient.LabSlack) -> None:
    raw: list[dict[str, Any]] = []
    requests: list[SocketModeRequest] = []
    client = SocketModeClient(app_token=slack.app_token, web_client=web(slack),
                              auto_reconnect_enabled=False,
                              on_message_listeners=[lambda m: raw.append(json.loads(m))])

    def listener(sm: Any, req: SocketModeRequest) -> None:
        requests.append(req)
        sm.send_socket_mode_response(SocketModeResponse(
            envelope_id=req.envelope_id, payload={"text": f"ack {req.payload['text']}"}))

    client.socket_mode_request_listeners.append(listener)
    try:
        client.connect()
        hello = wait_for(lambda: [m for m in raw if m.get("type") == "hello"], "hello")[0]
        assert hello["num_connections"] == 1
        assert hello["connection_info"] == {"app_id": "A0LAB"}
        assert slackclient.socket_clients(slack.url) == 1
        sent = slackclient.socket_command(slack.url, "list", user_id="U0ALICE")
        ack = slackclient.wait_for_ack(slack.url, sent["envelope_id"])
        assert ack["payload"] == {"text": "ack list"} and ack["known"] and not ack["late"]
        assert requests[0].type == "slash_commands" and requests[0].accepts_response_payload
        assert requests[0].payload["response_url"] == sent["response_url"]
        # Redelivery: the same envelope again is acked again.
        slackclient.socket_send(slack.url, "slash_commands", requests[0].payload,
                                envelope_id=sent["envelope_id"])
        wait_for(lambda: len(slackclient.socket_acks(slack.url, sent["envelope_id"])) == 2,
                 "the second ack")
        # The slash command's ack payload shows as an ephemeral message, as in Slack.
        first = slackclient.messages(slack.url)["ephemeral"][0]
        assert (first["to_user"], first["text"], first["via"]) == ("U0ALICE", "ack list", "ack")
        assert [c["method"] for c in slackclient.calls(slack.url)] == ["apps.connections.open"]
        slackclient.socket_close(slack.url)  # else close() waits for its 3 s recv timeout
        wait_for(lambda: not client.is_connected(), "the client to see the close")
    finally:
        client.close()
    wait_for(lambda: slackclient.socket_clients(slack.url) == 0, "the client to go")


class RawSocket:
    """A hand-rolled WebSocket client, to send what slack_sdk never does: fragments,
    pings, unmasked frames, a message of megabytes."""

    def __init__(self, socket_url: str) -> None:
        url = urllib.parse.urlsplit(socket_url)
        self.sock = socket.create_connection((url.hostname, url.port), timeout=10)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {url.path}?{url.query} HTTP/1.1\r\nHost: {url.netloc}\r\n"
                           "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                           f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
                           ).encode())
        self.reader = self.sock.makefile("rb")
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            head += self.reader.read(1)
        assert head.startswith(b"HTTP/1.1 101 ")
        accept = base64.b64encode(hashlib.sha1(
            (key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        assert f"Sec-WebSocket-Accept: {accept}".encode() in head

    def send(self, opcode: int, data: bytes, fin: bool = True, masked: bool = True) -> None:
        n = len(data)
        head = bytes([(0x80 if fin else 0) | opcode])
        bit = 0x80 if masked else 0
        if n < 126:
            head += bytes([bit | n])
        elif n < 65536:
            head += bytes([bit | 126]) + struct.pack("!H", n)
        else:
            head += bytes([bit | 127]) + struct.pack("!Q", n)
        if masked:
            mask = os.urandom(4)
            key = (mask * (n // 4 + 1))[:n]
            data = mask + (int.from_bytes(data, "big") ^ int.from_bytes(key, "big")).to_bytes(
                n, "big") if n else mask
        self.sock.sendall(head + data)

    def receive(self) -> tuple[int, bytes]:
        b1, b2 = self.reader.read(2)
        n = b2 & 0x7F
        if n == 126:
            (n,) = struct.unpack("!H", self.reader.read(2))
        elif n == 127:
            (n,) = struct.unpack("!Q", self.reader.read(8))
        assert not b2 & 0x80, "server frames are never masked"
        return b1 & 0x0F, self.reader.read(n)

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


def test_websocket_fragments_pings_big_messages_and_unmasked_frames(
        slack: slackclient.LabSlack) -> None:
    url = web(slack, token=slack.app_token).apps_connections_open(app_token=slack.app_token)
    ws = RawSocket(url["url"])
    try:
        opcode, hello = ws.receive()
        assert opcode == 1 and json.loads(hello)["type"] == "hello"
        sent = slackclient.socket_send(slack.url, "events_api", {"event": {"type": "x"}})
        opcode, data = ws.receive()
        envelope = json.loads(data)
        assert envelope["envelope_id"] == sent["envelope_id"]
        assert (envelope["retry_attempt"], envelope["retry_reason"]) == (0, "")
        assert envelope["accepts_response_payload"] is False
        ack = json.dumps({"envelope_id": sent["envelope_id"],
                          "payload": {"blob": "y" * 3_000_000}}).encode()
        third = len(ack) // 3
        ws.send(1, ack[:third], fin=False)
        ws.send(9, b"ping-in-between")  # control frames may come between fragments
        ws.send(0, ack[third:2 * third], fin=False)
        ws.send(0, ack[2 * third:])
        assert ws.receive() == (10, b"ping-in-between")
        got = slackclient.wait_for_ack(slack.url, sent["envelope_id"])
        assert len(got["payload"]["blob"]) == 3_000_000
        big = slackclient.socket_send(slack.url, "events_api", {"blob": "z" * 2_000_000})
        opcode, data = ws.receive()  # sent as one frame of 2 MB
        assert json.loads(data)["envelope_id"] == big["envelope_id"] and len(data) > 2_000_000
        ws.send(1, b'{"envelope_id": "x"}', masked=False)
        opcode, data = ws.receive()
        assert opcode == 8 and struct.unpack("!H", data[:2])[0] == 1002
    finally:
        ws.close()
    wait_for(lambda: slackclient.socket_clients(slack.url) == 0, "the connection to close")
    # A ticket apps.connections.open never issued is refused before the upgrade.
    conn = http.client.HTTPConnection(urllib.parse.urlsplit(slack.url).netloc, timeout=10)
    conn.request("GET", "/socket?ticket=made-up", headers={
        "Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode()})
    assert conn.getresponse().status == 401
    conn.close()


class Recorder(BaseHTTPRequestHandler):
    """A stand-in bot: records the request and answers 200 with a slash command reply."""

    seen: ClassVar[list[tuple[dict[str, str], str]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"])).decode()
        Recorder.seen.append((dict(self.headers.items()), body))
        data = json.dumps({"response_type": "in_channel", "text": "on it"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[str]:
    Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/slack/events"
    server.shutdown()
    server.server_close()


def test_signed_command_click_and_response_url(slack: slackclient.LabSlack,
                                               recorder: str) -> None:
    verifier = SignatureVerifier(slack.signing_secret)
    sent = slackclient.send_command(recorder, slack.signing_secret, 'run drain-node node=gpu03',
                                    user_id="U0ALICE", fake_url=slack.url)
    assert (sent.status, sent.json()) == (200, {"response_type": "in_channel", "text": "on it"})
    headers, body = Recorder.seen[-1]
    assert verifier.is_valid(body, headers["X-Slack-Request-Timestamp"],
                             headers["X-Slack-Signature"])
    fields = {k: v[0] for k, v in parse_qs(body).items()}
    assert (fields["command"], fields["text"], fields["user_name"]) \
        == ("/runbook", "run drain-node node=gpu03", "alice")
    assert fields["response_url"] == sent.response_url and fields["trigger_id"]
    # The in_channel answer is now a channel message; the response_url posts ephemerally.
    assert [m["text"] for m in slackclient.messages(slack.url)["messages"]] == ["on it"]
    for n in range(5):
        request = urllib.request.Request(str(sent.response_url), method="POST",
                                         data=json.dumps({"text": f"step {n}"}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.read() == b"ok"
    with pytest.raises(urllib.error.HTTPError) as used:
        urllib.request.urlopen(request, timeout=10)
    with used.value:
        assert used.value.code == 404 and json.load(used.value)["error"] == "used_url"
    made_up = urllib.request.Request(f"{slack.url}/_lab/response/made-up", method="POST",
                                     data=b'{"text": "hi"}',
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as unknown:
        urllib.request.urlopen(made_up, timeout=10)
    with unknown.value:
        assert unknown.value.code == 404 and json.load(unknown.value)["error"] == "no_service"
    kept = {r["id"]: r for r in slackclient.fake_call(slack.url, "GET", "responses")}
    assert kept["made-up"]["unregistered"] and kept["made-up"]["posts"][0]["body"] \
        == {"text": "hi"}
    # A forged and a stale request: signatures a verifier refuses.
    slackclient.send_command(recorder, slack.signing_secret, "x", user_id="U0BOB",
                             fake_url=slack.url, sign_secret="not-the-secret")
    headers, body = Recorder.seen[-1]
    assert not verifier.is_valid(body, headers["X-Slack-Request-Timestamp"],
                                 headers["X-Slack-Signature"])
    slackclient.send_command(recorder, slack.signing_secret, "x", user_id="U0BOB",
                             fake_url=slack.url, timestamp=int(time.time()) - 600,
                             headers={"X-Slack-Retry-Num": "1"})
    headers, body = Recorder.seen[-1]
    assert not verifier.is_valid(body, headers["X-Slack-Request-Timestamp"],
                                 headers["X-Slack-Signature"])
    assert headers["X-Slack-Retry-Num"] == "1"
    # A click on a button the bot posted: the payload carries that message and block.
    posted = web(slack).chat_postMessage(channel="C0RUNBOOK", text="approve?", blocks=[
        {"type": "actions", "block_id": "decide", "elements": [
            {"type": "button", "action_id": "approve", "value": "42",
             "text": {"type": "plain_text", "text": "Approve"}}]}])
    clicked = slackclient.send_click(recorder, slack.signing_secret, "approve", "42",
                                     user_id="U0CAROL", fake_url=slack.url)
    headers, body = Recorder.seen[-1]
    assert verifier.is_valid(body, headers["X-Slack-Request-Timestamp"],
                             headers["X-Slack-Signature"])
    payload = json.loads(parse_qs(body)["payload"][0])
    assert payload["type"] == "block_actions" and payload["user"]["id"] == "U0CAROL"
    assert payload["container"]["message_ts"] == posted["ts"]
    assert payload["actions"][0] == {**payload["actions"][0], "action_id": "approve",
                                     "value": "42", "block_id": "decide", "type": "button"}
    assert payload["message"]["blocks"][0]["block_id"] == "decide"
    # replace_original through the click's response_url replaces the message.
    request = urllib.request.Request(str(clicked.response_url), method="POST", data=json.dumps(
        {"replace_original": True, "text": "approved by carol"}).encode(),
        headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=10).close()
    texts = {m["ts"]: m for m in slackclient.messages(slack.url)["messages"]}
    assert texts[posted["ts"]]["text"] == "approved by carol"
    assert "blocks" not in texts[posted["ts"]]
