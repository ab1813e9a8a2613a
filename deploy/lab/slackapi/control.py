"""The lab's control endpoints under /_lab/, for tests: one function per route, in ROUTES by
(HTTP verb, path). /_lab/response/<id>[/ack] are the response URLs that payloads carry; what
is posted there shows in the channel as Slack would show it."""
from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from . import files, responses
from .journal import FaultError
from .plumbing import BadRequest, content_type, first_values
from .workspace import (
    APP_ID,
    BOT_ID,
    BOT_NAME,
    BOT_USER,
    CHANNEL,
    CHANNELS,
    PEOPLE,
    TEAM_DOMAIN,
    TEAM_ID,
    TEAM_NAME,
    TEAM_URL,
    USERGROUPS,
    Workspace,
)

if TYPE_CHECKING:
    from .server import Handler

Obj = dict[str, Any]
Query = dict[str, str]
Route = Callable[["Handler", Query], None]
ENVELOPE_TYPES = ("slash_commands", "interactive", "events_api")
DISCONNECT_REASONS = ("warning", "refresh_requested", "link_disabled")
OK = {"ok": True}
NO_SOCKET = {"ok": False, "error": "no_socket_connection"}


def handle(req: Handler, path: str, query: Query) -> None:
    """/_lab/PATH (no slashes around it): a response URL, else the route in ROUTES."""
    if path.startswith("response/"):
        response_url(req, path[len("response/"):])
        return
    route = ROUTES.get((req.command, path)) or ROUTES.get(("*", path))
    if route is None:
        req.read_body()
        raise BadRequest(404, f"no lab endpoint {req.command} /_lab/{path}")
    route(req, query)


def response_base(req: Handler) -> str:
    return f"http://{req.host()}/_lab/response/"


# --- the workspace, the calls, faults --------------------------------------------------------

def health(req: Handler, query: Query) -> None:
    req.send_json(200, {"ok": True, "clients": len(req.server.hub.open())})


def workspace(req: Handler, query: Query) -> None:
    req.send_json(200, workspace_view())


def list_calls(req: Handler, query: Query) -> None:
    calls = req.server.journal.list_calls(query.get("method"))
    since = int(query.get("since") or 0)
    req.send_json(200, [c for c in calls if c["id"] > since])


def clear_calls(req: Handler, query: Query) -> None:
    journal = req.server.journal
    with journal.lock:
        journal.calls = []
    req.send_json(200, OK)


def messages(req: Handler, query: Query) -> None:
    req.send_json(200, messages_view(req.server.ws, query.get("channel")))


def list_faults(req: Handler, query: Query) -> None:
    req.send_json(200, req.server.journal.list_faults())


def arm_fault(req: Handler, query: Query) -> None:
    try:
        fault = req.server.journal.arm(req.json_body())
    except FaultError as exc:
        raise BadRequest(400, str(exc)) from None
    req.send_json(200, {"ok": True, "fault": fault})


def clear_faults(req: Handler, query: Query) -> None:
    req.server.journal.clear_faults()
    req.send_json(200, OK)


def reset(req: Handler, query: Query) -> None:
    req.server.ws.reset()
    req.server.journal.reset()
    req.send_json(200, OK)


# --- response URLs ---------------------------------------------------------------------------

def list_responses(req: Handler, query: Query) -> None:
    req.send_json(200, req.server.journal.list_responses())


def register_response(req: Handler, query: Query) -> None:
    """A response URL for a payload ({type, payload}) or for a context given field by field."""
    body = req.json_body()
    if not isinstance(body, dict):
        raise BadRequest(400, "expected a JSON object")
    if "payload" in body:
        if body.get("type") not in ENVELOPE_TYPES or not isinstance(body["payload"], dict):
            raise BadRequest(400, "type must be slash_commands|interactive and payload "
                             "an object")
        ctx = responses.context(body["type"], body["payload"])
    else:
        ctx = {k: body.get(k) for k in ("type", "channel", "user", "message_ts",
                                         "thread_ts", "is_ephemeral")}
    record = req.server.journal.register_response(ctx, body.get("ttl"), body.get("max_uses"))
    req.send_json(200, {"ok": True, "id": record["id"],
                        "url": response_base(req) + record["id"]})


def response_url(req: Handler, rest: str) -> None:
    """GET ID (the record), POST ID (a response_url post), POST ID/ack (an immediate answer)."""
    rid, _, sub = rest.partition("/")
    if req.command == "GET" and not sub:
        record = req.server.journal.response(rid)
        if record is None:
            raise BadRequest(404, "no_service")
        req.send_json(200, record)
        return
    if req.command != "POST" or sub not in ("", "ack"):
        req.read_body()
        raise BadRequest(405, "method_not_allowed")
    post_response(req, rid, ack=bool(sub))


def post_response(req: Handler, rid: str, ack: bool) -> None:
    """Slack's answers: 200 `ok` (text/plain), 404 used_url/expired_url/no_service, or the
    JSON error of a body it cannot show."""
    raw = req.read_body()
    mime, _ = content_type(req.headers.get("Content-Type"))
    if mime == "application/x-www-form-urlencoded" and not ack:
        raw = first_values(parse_qsl(raw.decode(errors="replace"))).get("payload",
                                                                         "").encode()
    body = responses.as_body(raw)
    record, refusal = req.server.journal.use_response(rid, body, "ack" if ack else "post")
    if record is None or refusal:
        req.send_json(404, {"ok": False, "error": refusal or "no_service"})
        return
    code, answer = responses.apply(req.server.ws, record, body,
                                   "ack" if ack else "response_url")
    if code == 200:
        req.send_text(200, answer)
    else:
        req.send_body(code, answer.encode(), "application/json; charset=utf-8")


# --- Socket Mode -----------------------------------------------------------------------------

def socket_send(req: Handler, query: Query) -> None:
    """Send an envelope {type, payload} to one connection (or every one: broadcast)."""
    body = req.json_body()
    kind, payload = body.get("type"), body.get("payload")
    if kind not in ENVELOPE_TYPES or not isinstance(payload, dict):
        raise BadRequest(400, f"type must be one of {', '.join(ENVELOPE_TYPES)} "
                         "and payload a JSON object")
    hub, journal = req.server.hub, req.server.journal
    if not hub.wait(float(body.get("wait") or 0)):
        req.send_json(409, NO_SOCKET)
        return
    response_id, url, payload = with_response_url(req, kind, payload)
    envelope = make_envelope(body, kind, payload)
    delivered = hub.deliver(envelope, bool(body.get("broadcast")))
    if not delivered:
        req.send_json(409, NO_SOCKET)
        return
    journal.record_envelope(envelope, delivered)
    if response_id:
        with journal.lock:
            journal.envelopes[-1]["response_id"] = response_id
    req.send_json(200, {"ok": True, "envelope_id": envelope["envelope_id"],
                        "delivered_to": delivered, "response_url": url})


def with_response_url(req: Handler, kind: str, payload: Obj) -> tuple[str | None, str | None,
                                                                      Obj]:
    """(response id, URL, payload): Slack puts a response_url into slash commands and
    block/message actions; a shortcut gets one registered but not in its payload."""
    interaction = payload.get("type")
    if not (kind == "slash_commands" or (kind == "interactive" and interaction in
                                         ("block_actions", "message_action", "shortcut"))):
        return None, None, payload
    response_id = req.server.journal.register_response(responses.context(kind, payload))["id"]
    url = response_base(req) + response_id
    if kind != "interactive" or interaction != "shortcut":
        payload = {**payload}
        payload.setdefault("response_url", url)
    return response_id, url, payload


def make_envelope(body: Obj, kind: str, payload: Obj) -> Obj:
    interaction = payload.get("type")
    accepts = body.get("accepts_response_payload")
    if accepts is None:
        accepts = kind == "slash_commands" or interaction in (
            "view_submission", "block_suggestion")
    envelope: Obj = {"envelope_id": body.get("envelope_id") or str(uuid.uuid4()),
                     "payload": payload, "type": kind,
                     "accepts_response_payload": bool(accepts)}
    if kind == "events_api":
        envelope.update(retry_attempt=int(body.get("retry_attempt") or 0),
                        retry_reason=str(body.get("retry_reason") or ""))
    return envelope


def list_acks(req: Handler, query: Query) -> None:
    req.send_json(200, req.server.journal.list_acks(query.get("envelope_id")))


def clear_acks(req: Handler, query: Query) -> None:
    journal = req.server.journal
    with journal.lock:
        journal.acks = []
    req.send_json(200, OK)


def list_envelopes(req: Handler, query: Query) -> None:
    journal = req.server.journal
    with journal.lock:
        req.send_json(200, journal.envelopes)


def socket_clients(req: Handler, query: Query) -> None:
    hub = req.server.hub
    conns = hub.open()
    req.send_json(200, {"clients": len(conns), "ready": len(hub.ready()),
                        "connections": [c.view() for c in conns]})


def socket_disconnect(req: Handler, query: Query) -> None:
    """Slack's `disconnect` message to every ready connection (then no envelopes go there);
    close_after: close them that many seconds later."""
    body = req.json_body()
    reason = body.get("reason") or "refresh_requested"
    if reason not in DISCONNECT_REASONS:
        raise BadRequest(400, "reason must be warning, refresh_requested or link_disabled")
    message = {"type": "disconnect", "reason": reason, "debug_info": {"host": "applink-lab"}}
    conns = req.server.hub.ready()
    for conn in conns:
        conn.draining = True
        try:
            conn.ws.send_text(json.dumps(message))
        except Exception:
            continue
    close_after = body.get("close_after")
    if close_after is not None:
        def close_later() -> None:
            time.sleep(float(close_after))
            for conn in conns:
                conn.ws.close(1001, reason)
        threading.Thread(target=close_later, daemon=True).start()
    req.send_json(200, {"ok": True, "connections": [c.id for c in conns]})


def socket_close(req: Handler, query: Query) -> None:
    """Drop every connection without Slack's `disconnect` message first (a network cut, a
    server restart): close frame with the given code."""
    body = req.json_body()
    conns = req.server.hub.open()
    for conn in conns:
        conn.ws.close(int(body.get("code") or 1001), str(body.get("reason") or ""))
    req.send_json(200, {"ok": True, "connections": [c.id for c in conns]})


ROUTES: dict[tuple[str, str], Route] = {  # (verb, path); "*": any verb
    ("*", "health"): health,
    ("GET", "workspace"): workspace,
    ("GET", "calls"): list_calls,
    ("DELETE", "calls"): clear_calls,
    ("GET", "messages"): messages,
    ("GET", "faults"): list_faults,
    ("POST", "faults"): arm_fault,
    ("DELETE", "faults"): clear_faults,
    ("POST", "reset"): reset,
    ("GET", "responses"): list_responses,
    ("POST", "responses"): register_response,
    ("POST", "socket/send"): socket_send,
    ("GET", "socket/acks"): list_acks,
    ("DELETE", "socket/acks"): clear_acks,
    ("GET", "socket/envelopes"): list_envelopes,
    ("GET", "socket/clients"): socket_clients,
    ("POST", "socket/disconnect"): socket_disconnect,
    ("POST", "socket/close"): socket_close,
    ("GET", "files"): files.list_files,
    ("GET", "files/content"): files.file_content,
}


# --- views -----------------------------------------------------------------------------------

def workspace_view() -> Obj:
    return {
        "team": {"id": TEAM_ID, "name": TEAM_NAME, "domain": TEAM_DOMAIN, "url": TEAM_URL},
        "app_id": APP_ID,
        "bot": {"user_id": BOT_USER, "bot_id": BOT_ID, "name": BOT_NAME},
        "users": {uid: name for uid, (name, _) in PEOPLE.items()},
        "channels": {cid: {"name": seed["name"], "members": seed["members"]}
                     for cid, seed in CHANNELS.items()},
        "usergroups": {sid: {"handle": seed["handle"], "users": seed["users"]}
                       for sid, seed in USERGROUPS.items()},
        "default_channel": CHANNEL,
    }


def messages_view(ws: Workspace, channel: str | None) -> Obj:
    if channel:
        cid = ws.resolve(channel, names=True, users=True) or channel
        return ws.channel_view(cid)
    return {"channels": [ws.channel_view(cid) for cid in ws.channels_with_content()]}
