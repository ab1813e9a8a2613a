"""Play Slack towards the bot: signed slash commands and button clicks, Socket Mode envelopes,
and the lab Slack fake's control endpoints. Stdlib only; imports nothing else from the lab,
so tests can load it by path or with deploy/lab on sys.path (`from labkit import slackclient`).

HTTP mode, as Slack sends it: a POST of `application/x-www-form-urlencoded` to the bot's
request URL (`http://127.0.0.1:<bot port>/slack/events` in the lab) with
`X-Slack-Request-Timestamp` and `X-Slack-Signature: v0=hex(hmac_sha256(secret,
"v0:" + timestamp + ":" + body))`. A slash command is the command's fields; an interaction is
one field, `payload`, holding the JSON. The response_url in them points at the fake
(`/_lab/response/<id>`, registered first), which records what the bot posts there and shows it
in the channel as Slack would.

    fake = "http://127.0.0.1:PORT"              # lab.json slack.url
    d = send_command(events_url, secret, 'run drain-node node=gpu03 reason="x"',
                     user_id="U0ALICE", fake_url=fake)
    d.status, d.body                            # the bot's immediate answer
    d = send_click(events_url, secret, "approve", "42", user_id="U0CAROL", fake_url=fake)
"""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import secrets
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Obj = dict[str, Any]
TEAM_ID = "T0LAB"
TEAM_DOMAIN = "grblab"
APP_ID = "A0LAB"
CHANNEL = "C0RUNBOOK"
CHANNEL_NAMES = {"C0RUNBOOK": "gpu-ops", "C0GENERAL": "general"}
USERS = {"U0ALICE": "alice", "U0BOB": "bob", "U0CAROL": "carol", "U0DAVE": "dave"}
COMMAND = "/runbook"
USER_AGENT = "Slackbot 1.0 (+https://api.slack.com/robots)"
VERIFICATION_TOKEN = "lab-verification-token"  # Slack's deprecated field; nobody checks it


@dataclass
class Delivery:
    """One request sent to the bot and its answer."""

    status: int  # 0 when the bot could not be reached
    body: str
    headers: dict[str, str]
    elapsed: float
    trigger_id: str
    response_url: str | None
    request_body: str = field(repr=False)
    error: str | None = None  # connection error text when status is 0

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


# --- signing ------------------------------------------------------------------------------

def signature(secret: str, timestamp: str | int, body: str | bytes) -> str:
    """Slack's v0 signature of a request body."""
    raw = body.decode() if isinstance(body, bytes) else body
    base = f"v0:{timestamp}:{raw}".encode()
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def signed_headers(secret: str, body: str | bytes, timestamp: str | int | None = None
                   ) -> dict[str, str]:
    ts = str(int(time.time()) if timestamp is None else timestamp)
    return {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": signature(secret, ts, body)}


def new_trigger_id() -> str:
    """Shaped like Slack's: digits.digits.32 hex."""
    return (f"{int(time.time() * 1000)}{secrets.randbelow(10)}.{secrets.randbelow(10**10):010d}"
            f".{secrets.token_hex(16)}")


def name_of(user_id: str) -> str:
    """A lab user's name (U0ALICE -> alice); other IDs lower-cased."""
    return USERS.get(user_id, user_id.lower())


# --- payloads -----------------------------------------------------------------------------

def command_fields(text: str, *, user_id: str, response_url: str, user_name: str | None = None,
                   channel_id: str = CHANNEL, channel_name: str | None = None,
                   command: str = COMMAND, trigger_id: str | None = None) -> dict[str, str]:
    """A slash command's form fields, in Slack's order."""
    return {
        "token": VERIFICATION_TOKEN, "team_id": TEAM_ID, "team_domain": TEAM_DOMAIN,
        "channel_id": channel_id,
        "channel_name": channel_name or CHANNEL_NAMES.get(channel_id, "privategroup"),
        "user_id": user_id, "user_name": user_name or name_of(user_id),
        "command": command, "text": text, "api_app_id": APP_ID,
        "is_enterprise_install": "false", "response_url": response_url,
        "trigger_id": trigger_id or new_trigger_id(),
    }


def block_actions_payload(action_id: str, value: str, *, user_id: str, message_ts: str,
                          response_url: str | None, channel_id: str = CHANNEL,
                          block_id: str | None = None, button_text: str | None = None,
                          message: Obj | None = None, thread_ts: str | None = None,
                          trigger_id: str | None = None, is_ephemeral: bool = False) -> Obj:
    """A block_actions interaction: one button clicked on the message at message_ts."""
    name = name_of(user_id)
    container: Obj = {"type": "message", "message_ts": message_ts, "channel_id": channel_id,
                      "is_ephemeral": is_ephemeral}
    if thread_ts:
        container["thread_ts"] = thread_ts
    action: Obj = {"action_id": action_id, "block_id": block_id or "lab",
                   "text": {"type": "plain_text", "text": button_text or action_id,
                            "emoji": True},
                   "value": value, "type": "button", "action_ts": f"{time.time():.6f}"}
    payload: Obj = {
        "type": "block_actions",
        "user": {"id": user_id, "username": name, "name": name, "team_id": TEAM_ID},
        "api_app_id": APP_ID, "token": VERIFICATION_TOKEN, "container": container,
        "trigger_id": trigger_id or new_trigger_id(),
        "team": {"id": TEAM_ID, "domain": TEAM_DOMAIN}, "enterprise": None,
        "is_enterprise_install": False,
        "channel": {"id": channel_id, "name": CHANNEL_NAMES.get(channel_id, "privategroup")},
        "message": message or {"type": "message", "ts": message_ts, "user": "U0BOT",
                               "bot_id": "B0BOT", "text": ""},
        "state": {"values": {}},
        "actions": [action],
    }
    if response_url:
        payload["response_url"] = response_url
    return payload


# --- talking to the fake ------------------------------------------------------------------

def fake_call(fake_url: str, verb: str, path: str, body: Any = None, timeout: float = 10.0
              ) -> Any:
    """A control call to the fake (`path` under /_lab/); the parsed JSON answer."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{fake_url.rstrip('/')}/_lab/{path.lstrip('/')}",
                                     data=data, method=verb,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            raw = answer.read()
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            detail = json.loads(raw).get("error", raw.decode())
        except (ValueError, AttributeError):
            detail = raw.decode(errors="replace")
        raise FakeError(exc.code, str(detail)) from None
    return json.loads(raw) if raw else None


class FakeError(Exception):
    def __init__(self, status: int, error: str) -> None:
        super().__init__(f"{status} {error}")
        self.status = status
        self.error = error


def register_response_url(fake_url: str, kind: str, payload: Obj) -> tuple[str, str]:
    """(id, url) of a fresh response_url for this slash command or interaction."""
    found = fake_call(fake_url, "POST", "responses", {"type": kind, "payload": payload})
    return str(found["id"]), str(found["url"])


def calls(fake_url: str, method: str | None = None, since: int = 0) -> list[Obj]:
    query = urllib.parse.urlencode({k: v for k, v in (("method", method), ("since", since))
                                    if v})
    return list(fake_call(fake_url, "GET", "calls" + (f"?{query}" if query else "")))


def messages(fake_url: str, channel: str | None = CHANNEL) -> Obj:
    query = f"?channel={urllib.parse.quote(channel)}" if channel else ""
    return dict(fake_call(fake_url, "GET", "messages" + query))


def reset(fake_url: str) -> None:
    """Forget calls, messages, acks, envelopes, response URLs and faults."""
    fake_call(fake_url, "POST", "reset", {})


def arm_fault(fake_url: str, **spec: Any) -> Obj:
    """arm_fault(url, ratelimit=2, retry_after=1, method="chat.update"); also error=CODE,
    status=503 or delay=SECONDS, each with count=N."""
    return dict(fake_call(fake_url, "POST", "faults", spec)["fault"])


def clear_faults(fake_url: str) -> None:
    fake_call(fake_url, "DELETE", "faults")


def socket_send(fake_url: str, kind: str, payload: Obj, *, envelope_id: str | None = None,
                accepts_response_payload: bool | None = None, wait: float = 0.0,
                retry_attempt: int | None = None, retry_reason: str | None = None,
                broadcast: bool = False) -> Obj:
    """Send an envelope to a Socket Mode client; {envelope_id, delivered_to, response_url}.
    The same envelope_id twice is a redelivery. `wait`: seconds to wait for a client."""
    body: Obj = {"type": kind, "payload": payload, "wait": wait, "broadcast": broadcast}
    for key, value in (("envelope_id", envelope_id), ("retry_attempt", retry_attempt),
                       ("accepts_response_payload", accepts_response_payload),
                       ("retry_reason", retry_reason)):
        if value is not None:
            body[key] = value
    return dict(fake_call(fake_url, "POST", "socket/send", body))


def socket_acks(fake_url: str, envelope_id: str | None = None) -> list[Obj]:
    query = f"?envelope_id={urllib.parse.quote(envelope_id)}" if envelope_id else ""
    return list(fake_call(fake_url, "GET", "socket/acks" + query))


def wait_for_ack(fake_url: str, envelope_id: str, timeout: float = 10.0) -> Obj:
    deadline = time.monotonic() + timeout
    while True:
        acks = socket_acks(fake_url, envelope_id)
        if acks:
            return acks[-1]
        if time.monotonic() > deadline:
            raise TimeoutError(f"no ack for envelope {envelope_id} within {timeout:g}s")
        time.sleep(0.05)


def socket_close(fake_url: str, code: int = 1001) -> list[int]:
    """Drop every Socket Mode connection (no `disconnect` message first). Also makes
    slack_sdk's builtin client close at once instead of after its 3 s receive timeout."""
    return list(fake_call(fake_url, "POST", "socket/close", {"code": code})["connections"])


def socket_disconnect(fake_url: str, reason: str = "refresh_requested",
                      close_after: float | None = None) -> list[int]:
    """Slack's `disconnect` message (warning | refresh_requested | link_disabled) to every
    connection; the clients then reconnect. close_after: drop them after that many seconds."""
    body: Obj = {"reason": reason}
    if close_after is not None:
        body["close_after"] = close_after
    return list(fake_call(fake_url, "POST", "socket/disconnect", body)["connections"])


def socket_clients(fake_url: str) -> int:
    return int(fake_call(fake_url, "GET", "socket/clients")["clients"])


def find_button(fake_url: str, action_id: str, value: str | None = None,
                channel: str = CHANNEL, ts: str | None = None) -> tuple[Obj, Obj, Obj | None]:
    """(button, message, thread parent or None): the newest message of the channel (or the
    one at ts) carrying a button with this action_id (and value, when given)."""
    view = messages(fake_url, channel)
    candidates: list[tuple[Obj, Obj | None]] = []
    for m in view.get("messages", []):
        candidates.append((m, None))
        candidates.extend((r, m) for r in m.get("replies", []))
    candidates.extend((e, None) for e in view.get("ephemeral", []))
    candidates.sort(key=lambda pair: pair[0]["ts"], reverse=True)
    for message, parent in candidates:
        if message.get("deleted") or (ts is not None and message["ts"] != ts):
            continue
        for button in _buttons(message.get("blocks") or []):
            if button["action_id"] == action_id and value in (None, button.get("value")):
                return button, message, parent
    where = f"message {ts}" if ts else f"any message of {channel}"
    raise LookupError(f"no button {action_id!r}" + (f" with value {value!r}" if value else "")
                      + f" on {where}")


def _buttons(blocks: list[Any]) -> list[Obj]:
    found = []
    for block in blocks:
        if not isinstance(block, dict):
            continue
        elements = list(block.get("elements") or []) if block.get("type") == "actions" else []
        if isinstance(block.get("accessory"), dict):
            elements.append(block["accessory"])
        for el in elements:
            if isinstance(el, dict) and el.get("type") == "button":
                found.append({"block_id": block.get("block_id"), "action_id": el.get("action_id"),
                              "value": el.get("value"),
                              "text": (el.get("text") or {}).get("text", "")})
    return found


def public_message(m: Obj) -> Obj:
    """A stored message as it appears in an interaction payload (no lab bookkeeping)."""
    lab_keys = ("channel", "replies", "deleted", "updates", "posted_at", "via", "orphan",
                "to_user")
    return {k: v for k, v in m.items() if k not in lab_keys}


# --- HTTP requests to the bot -------------------------------------------------------------

def post_signed(url: str, body: str, secret: str, *, timestamp: str | int | None = None,
                sign_secret: str | None = None, headers: dict[str, str] | None = None,
                timeout: float = 10.0) -> tuple[int, dict[str, str], str, float, str | None]:
    """POST a form body signed as Slack signs it: (status, headers, body, seconds, error).
    sign_secret signs with another secret (a forged request); timestamp sets
    X-Slack-Request-Timestamp (a stale one); headers are added last (X-Slack-Retry-Num,
    X-Slack-Retry-Reason, or a replacement X-Slack-Signature)."""
    sent = {"Content-Type": "application/x-www-form-urlencoded", "User-Agent": USER_AGENT,
            "Accept": "application/json,*/*",
            **signed_headers(sign_secret or secret, body, timestamp), **(headers or {})}
    request = urllib.request.Request(url, data=body.encode(), method="POST", headers=sent)
    began = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return (answer.status, dict(answer.headers.items()), answer.read().decode(),
                    time.perf_counter() - began, None)
    except urllib.error.HTTPError as exc:
        return (exc.code, dict(exc.headers.items()), exc.read().decode(),
                time.perf_counter() - began, None)
    except OSError as exc:
        return 0, {}, "", time.perf_counter() - began, str(exc)


def send_command(events_url: str, signing_secret: str, text: str, *, user_id: str,
                 fake_url: str | None = None, response_url: str | None = None,
                 channel_id: str = CHANNEL, command: str = COMMAND,
                 trigger_id: str | None = None, timestamp: str | int | None = None,
                 sign_secret: str | None = None, headers: dict[str, str] | None = None,
                 timeout: float = 10.0) -> Delivery:
    """A signed slash command to the bot. The response_url is registered with the fake
    (fake_url) unless one is given; with the fake, a non-empty 200 answer is handed to it too,
    as Slack shows the immediate answer in the channel (ephemeral unless in_channel)."""
    trigger = trigger_id or new_trigger_id()
    fields = command_fields(text, user_id=user_id, response_url=response_url or "",
                            channel_id=channel_id, command=command, trigger_id=trigger)
    rid = None
    if response_url is None:
        if fake_url is None:
            raise ValueError("send_command needs fake_url (or an explicit response_url)")
        rid, fields["response_url"] = register_response_url(fake_url, "slash_commands", fields)
    body = urllib.parse.urlencode(fields)
    status, got, answer, took, error = post_signed(
        events_url, body, signing_secret, timestamp=timestamp, sign_secret=sign_secret,
        headers=headers, timeout=timeout)
    if fake_url and rid and status == 200 and answer.strip():
        _forward_ack(fake_url, rid, answer, got.get("Content-Type", "text/plain"))
    return Delivery(status, answer, got, took, trigger, fields["response_url"], body, error)


def _forward_ack(fake_url: str, rid: str, answer: str, ctype: str) -> None:
    request = urllib.request.Request(f"{fake_url.rstrip('/')}/_lab/response/{rid}/ack",
                                     data=answer.encode(), method="POST",
                                     headers={"Content-Type": ctype})
    # An answer Slack would not show (no text) is refused: nothing to add then.
    with contextlib.suppress(urllib.error.HTTPError):
        urllib.request.urlopen(request, timeout=10).close()


def send_click(events_url: str, signing_secret: str, action_id: str, value: str, *,
               user_id: str, fake_url: str | None = None, message_ts: str | None = None,
               channel_id: str = CHANNEL, block_id: str | None = None,
               response_url: str | None = None, trigger_id: str | None = None,
               timestamp: str | int | None = None, sign_secret: str | None = None,
               headers: dict[str, str] | None = None, timeout: float = 10.0) -> Delivery:
    """A signed block_actions click of button action_id/value. With fake_url the button is
    looked up on the channel's messages (the newest carrying it, or the one at message_ts;
    LookupError when there is none) and the payload carries that message, its block_id and
    button text, as Slack's does. Without the fake, message_ts is required."""
    message, parent, text, is_ephemeral = None, None, None, False
    if fake_url is not None and block_id is None:
        button, stored, parent = find_button(fake_url, action_id, value, channel_id, message_ts)
        message_ts, block_id, text = stored["ts"], button["block_id"], button["text"]
        is_ephemeral = "to_user" in stored
        message = public_message(stored)
    if message_ts is None:
        raise ValueError("send_click needs message_ts (or fake_url to find the button)")
    trigger = trigger_id or new_trigger_id()
    thread_ts = parent["ts"] if parent else (message or {}).get("thread_ts")
    payload = block_actions_payload(action_id, value, user_id=user_id, message_ts=message_ts,
                                    response_url=response_url, channel_id=channel_id,
                                    block_id=block_id, button_text=text, message=message,
                                    thread_ts=thread_ts, trigger_id=trigger,
                                    is_ephemeral=is_ephemeral)
    if response_url is None and fake_url is not None:
        _, payload["response_url"] = register_response_url(fake_url, "interactive", payload)
    body = urllib.parse.urlencode({"payload": json.dumps(payload)})
    status, got, answer, took, error = post_signed(
        events_url, body, signing_secret, timestamp=timestamp, sign_secret=sign_secret,
        headers=headers, timeout=timeout)
    return Delivery(status, answer, got, took, trigger, payload.get("response_url"), body,
                    error)


# --- the same over Socket Mode ----------------------------------------------------------

def socket_command(fake_url: str, text: str, *, user_id: str, channel_id: str = CHANNEL,
                   command: str = COMMAND, wait: float = 5.0, **options: Any) -> Obj:
    """A slash command as a Socket Mode envelope (the fake adds the response_url)."""
    fields: Obj = command_fields(text, user_id=user_id, response_url="",
                                 channel_id=channel_id, command=command)
    del fields["response_url"]
    return socket_send(fake_url, "slash_commands", fields, wait=wait, **options)


def socket_click(fake_url: str, action_id: str, value: str, *, user_id: str,
                 message_ts: str | None = None, channel_id: str = CHANNEL,
                 wait: float = 5.0, **options: Any) -> Obj:
    """A button click as a Socket Mode `interactive` envelope (button looked up as in
    send_click; the fake adds the response_url)."""
    button, stored, parent = find_button(fake_url, action_id, value, channel_id, message_ts)
    payload = block_actions_payload(
        action_id, value, user_id=user_id, message_ts=stored["ts"], response_url=None,
        channel_id=channel_id, block_id=button["block_id"], button_text=button["text"],
        message=public_message(stored), thread_ts=parent["ts"] if parent else None,
        is_ephemeral="to_user" in stored)
    return socket_send(fake_url, "interactive", payload, wait=wait, **options)


# --- the lab --------------------------------------------------------------------------

@dataclass
class LabSlack:
    """Everything about the lab's Slack, from lab.json and the secrets file."""

    url: str  # the fake: http://127.0.0.1:PORT
    api_url: str  # SLACK_API_URL: http://127.0.0.1:PORT/api/
    events_url: str  # the bot's request URL
    channel: str
    bot_token: str = field(repr=False)
    app_token: str = field(repr=False)
    signing_secret: str = field(repr=False)

    @classmethod
    def from_info(cls, info: Obj) -> LabSlack:
        slack = info["slack"]
        data = json.loads(Path(slack["tokens_file"]).read_text())
        return cls(url=slack["url"], api_url=slack["api_url"],
                   events_url=slack["bot_events_url"], channel=slack["channel"],
                   bot_token=data["bot_token"], app_token=data["app_token"],
                   signing_secret=data["signing_secret"])

    @classmethod
    def from_lab_dir(cls, lab_dir: str | Path) -> LabSlack:
        return cls.from_info(json.loads((Path(lab_dir) / "lab.json").read_text()))

    def command(self, text: str, user_id: str, **options: Any) -> Delivery:
        return send_command(self.events_url, self.signing_secret, text, user_id=user_id,
                            fake_url=self.url, **{"channel_id": self.channel, **options})

    def click(self, action_id: str, value: str, user_id: str, **options: Any) -> Delivery:
        return send_click(self.events_url, self.signing_secret, action_id, value,
                          user_id=user_id, fake_url=self.url,
                          **{"channel_id": self.channel, **options})


# --- printing -------------------------------------------------------------------------

def _block_lines(blocks: list[Any]) -> list[str]:
    lines: list[str] = []
    for block in blocks:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind in ("section", "header"):
            text = (block.get("text") or {}).get("text", "")
            fields = [f.get("text", "") for f in block.get("fields") or [] if isinstance(f, dict)]
            lines.extend(line for line in [text, *fields] if line)
            if isinstance(block.get("accessory"), dict):
                lines.extend(_button_lines([block["accessory"]]))
        elif kind == "context":
            lines.append(" | ".join(str(e.get("text", "")) for e in block.get("elements") or []
                                    if isinstance(e, dict)))
        elif kind == "actions":
            lines.extend(_button_lines(block.get("elements") or []))
        elif kind == "divider":
            lines.append("----")
        else:
            lines.append(f"[{kind} block]")
    return lines


def _button_lines(elements: list[Any]) -> list[str]:
    shown = []
    for el in elements:
        if isinstance(el, dict) and el.get("type") == "button":
            label = (el.get("text") or {}).get("text", "")
            style = f" {el['style']}" if el.get("style") else ""
            shown.append(f"[{label}{style}: {el.get('action_id')}={el.get('value', '')}]")
        elif isinstance(el, dict):
            shown.append(f"[{el.get('type')}: {el.get('action_id')}]")
    return [" ".join(shown)] if shown else []


def _message_lines(m: Obj, indent: str) -> list[str]:
    flags = []
    if m.get("updates"):
        flags.append(f"edited x{m['updates']}")
    if m.get("deleted"):
        flags.append("deleted")
    if m.get("via") not in (None, "chat.postMessage", "chat.postEphemeral"):
        flags.append(f"via {m['via']}")
    head = f"{indent}{m['ts']} {m.get('user', '?')}"
    if "to_user" in m:
        head += f" (only visible to {m['to_user']})"
    if flags:
        head += f" ({', '.join(flags)})"
    lines = [head + ":"]
    body = _block_lines(m.get("blocks") or []) or [m.get("text", "")]
    lines.extend(f"{indent}    {line}" for chunk in body for line in str(chunk).splitlines())
    return lines


def render_messages(view: Obj) -> str:
    """A channel view of GET /_lab/messages as text, replies indented under their parent."""
    views = view.get("channels", [view])
    out: list[str] = []
    for v in views:
        out.append(f"#{v.get('name') or v['channel']} ({v['channel']})")
        for m in v.get("messages", []):
            out.extend(_message_lines(m, "  "))
            for r in m.get("replies", []):
                out.extend(_message_lines(r, "      | "))
        for e in v.get("ephemeral", []):
            out.extend(_message_lines(e, "  ~ "))
        for o in v.get("orphans", []):
            out.extend(_message_lines(o, f"  ? thread {o.get('thread_ts')} not found: "))
        if not any(v.get(k) for k in ("messages", "ephemeral", "orphans")):
            out.append("  (no messages)")
    return "\n".join(out) if out else "(no messages)"
