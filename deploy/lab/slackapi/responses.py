"""What Slack does with a response_url post and with a slash command's immediate answer.

- A new message by default: ephemeral to the user who ran the command or clicked
  (`response_type: ephemeral`, Slack's default), or a channel message with
  `response_type: in_channel` (a thread reply with `thread_ts`).
- `replace_original: true` (interactions) replaces the message the button was on: the whole
  content (text, blocks, attachments) becomes the new one.
- `delete_original: true` (interactions) deletes that message.
- A slash command's immediate answer (the bot's HTTP 200 body, or the Socket Mode ack payload)
  is shown the same way; an interaction's immediate answer is ignored by Slack.

A response_url works up to 5 times within 30 minutes; then it answers 404 `used_url` /
`expired_url`. Success answers 200 `ok` (text/plain), like Slack's webhooks.
"""
from __future__ import annotations

import json
from typing import Any

from .methods import ApiError, content, has_content
from .workspace import BLOCKS_ONLY_TEXT, Workspace

Obj = dict[str, Any]


def context(kind: str, payload: Obj) -> Obj:
    """Where answers to this slash command or interaction go."""
    if kind == "slash_commands":
        return {"type": kind, "channel": payload.get("channel_id"),
                "user": payload.get("user_id"), "command": payload.get("command")}
    container = payload.get("container") or {}
    channel = payload.get("channel") or {}
    user = payload.get("user") or {}
    return {"type": kind, "interaction": payload.get("type"),
            "channel": channel.get("id") or container.get("channel_id"),
            "user": user.get("id"), "message_ts": container.get("message_ts"),
            "thread_ts": container.get("thread_ts"),
            "is_ephemeral": bool(container.get("is_ephemeral"))}


def as_body(raw: Any) -> Obj:
    """A posted body: a JSON object, or plain text (which Slack shows as the text)."""
    if isinstance(raw, dict):
        return raw
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw or "")
    if text.lstrip().startswith("{"):
        try:
            parsed = json.loads(text)
        except ValueError:
            return {"text": text}
        if isinstance(parsed, dict):
            return parsed
    return {"text": text} if text else {}


def apply(ws: Workspace, ctx: Obj, body: Obj, origin: str) -> tuple[int, str]:
    """Carry out one answer; (HTTP status, body) as Slack's response_url answers."""
    if origin == "ack" and ctx.get("type") != "slash_commands":
        return 200, "ok"  # Slack ignores an interaction's immediate answer
    if origin == "ack" and not body:
        return 200, "ok"  # an empty ack shows nothing
    cid, ts = ctx.get("channel"), ctx.get("message_ts")
    if not cid:
        return 404, json.dumps({"ok": False, "error": "channel_not_found"})
    if origin != "ack" and ts and (body.get("delete_original") in (True, "true")
                                   or body.get("replace_original") in (True, "true")):
        found = ws.find(cid, ts)
        original = found[0] if found else ws.find_ephemeral(cid, ts)
        if original is None:
            return 404, json.dumps({"ok": False, "error": "message_not_found"})
        if body.get("delete_original") in (True, "true"):
            ws.delete(original)
            return 200, "ok"
        try:
            c = content(body, f"response/{ws.clock}")
        except ApiError as exc:
            return 400, json.dumps(exc.body())
        if not has_content(c):
            return 400, json.dumps({"ok": False, "error": "no_text"})
        c.setdefault("text", BLOCKS_ONLY_TEXT if c.get("blocks") else "")
        ws.update(original, c, keep_missing=False)
        return 200, "ok"
    try:
        c = content(body, f"response/{ws.clock}")
    except ApiError as exc:
        return 400, json.dumps(exc.body())
    if not has_content(c):
        return 400, json.dumps({"ok": False, "error": "no_text"})
    if c.get("blocks") and not c.get("text"):
        c["text"] = BLOCKS_ONLY_TEXT
    thread_ts = body.get("thread_ts") or ctx.get("thread_ts")
    via = "response_url" if origin != "ack" else "ack"
    if body.get("response_type") == "in_channel":
        ws.post(cid, c, thread_ts=thread_ts, via=via)
    else:
        ws.post_ephemeral(cid, str(ctx.get("user")), c, thread_ts, via=via)
    return 200, "ok"
