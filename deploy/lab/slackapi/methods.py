"""The Web API methods, answered in Slack's shapes and with Slack's errors.

Argument rules follow Slack: a required argument that is absent answers `invalid_arguments`
(with `response_metadata.messages` "[ERROR] missing required field: NAME"); one that is present
but names nothing answers the method's own error (`channel_not_found`, `message_not_found`,
`user_not_found`, `no_such_subteam`). Tokens: bot-token methods answer
`not_allowed_token_type` to the app token and apps.connections.open to the bot token; a
bot-token method whose scope the manifest does not grant answers `missing_scope` (scopes.py).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import blocks as bk
from . import scopes
from .journal import Journal
from .workspace import (
    APP_ID,
    BLOCKS_ONLY_TEXT,
    BOT_ID,
    BOT_NAME,
    BOT_USER,
    CHANNELS,
    MAX_TEXT,
    PEOPLE,
    TEAM_ID,
    TEAM_NAME,
    TEAM_URL,
    USERGROUPS,
    Workspace,
    api_message,
    channel_object,
    user_object,
    usergroup_object,
)

Obj = dict[str, Any]
MAX_ATTACHMENTS = 100


class ApiError(Exception):
    """An `ok: false` answer."""

    def __init__(self, error: str, messages: list[str] | None = None,
                 extra: Obj | None = None) -> None:
        super().__init__(error)
        self.error = error
        self.messages = messages
        self.extra = extra or {}

    def body(self) -> Obj:
        body: Obj = {"ok": False, "error": self.error, **self.extra}
        if self.messages:
            body["response_metadata"] = {"messages": self.messages}
        return body


@dataclass
class Call:
    method: str
    args: Obj
    token: str  # bot | app | invalid | none
    host: str  # host:port the client reached us on (for apps.connections.open)
    ws: Workspace
    journal: Journal
    scopes: frozenset[str]  # the bot token's scopes (the app manifest's)


def flag(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.lower() in ("true", "1")) \
        or (isinstance(value, int) and not isinstance(value, bool) and value == 1)


def required(args: Obj, *names: str) -> None:
    missing = [n for n in names if n not in args or args[n] is None]
    if missing:
        raise ApiError("invalid_arguments",
                       [f"[ERROR] missing required field: {n}" for n in missing])


def text_arg(args: Obj, name: str) -> str:
    value = args.get(name)
    return "" if value is None else str(value)


def content(args: Obj, seed: str) -> Obj:
    """text/blocks/attachments/metadata of a message, parsed and checked; only the given ones.
    Raises invalid_blocks_format, invalid_blocks, too_many_attachments,
    invalid_attachments, invalid_metadata_format."""
    out: Obj = {}
    for name in ("text", "markdown_text"):
        if args.get(name) is not None:
            out["text"] = text_arg(args, name)[:MAX_TEXT]  # Slack truncates past 40,000
    if "blocks" in args and args["blocks"] is not None:
        try:
            parsed = bk.json_arg(args["blocks"])
            if parsed is not None:
                out["blocks"], errors = bk.check_blocks(parsed, seed)
                if errors:
                    raise ApiError("invalid_blocks", errors)
        except bk.NotJson:
            raise ApiError("invalid_blocks_format") from None
    if "attachments" in args and args["attachments"] is not None:
        try:
            parsed = bk.json_arg(args["attachments"])
        except bk.NotJson:
            raise ApiError("invalid_attachments") from None
        if parsed is not None:
            if not isinstance(parsed, list) or not all(isinstance(a, dict) for a in parsed):
                raise ApiError("invalid_attachments")
            if len(parsed) > MAX_ATTACHMENTS:
                raise ApiError("too_many_attachments")
            out["attachments"] = parsed
    if args.get("metadata") is not None:
        try:
            parsed = bk.json_arg(args["metadata"])
        except bk.NotJson:
            raise ApiError("invalid_metadata_format") from None
        if parsed is not None:
            if not isinstance(parsed, dict) or "event_type" not in parsed:
                raise ApiError("invalid_metadata_format")
            out["metadata"] = parsed
    return out


def has_content(c: Obj) -> bool:
    return bool(c.get("text") or c.get("blocks") or c.get("attachments"))


def resolve(call: Call, names: bool, users: bool, arg: str = "channel") -> str:
    required(call.args, arg)
    cid = call.ws.resolve(text_arg(call.args, arg), names=names, users=users)
    if cid is None:
        raise ApiError("channel_not_found")
    return cid


def seed_of(call: Call) -> str:
    return f"{call.method}/{call.ws.clock}"


# --- methods -------------------------------------------------------------------

def api_test(call: Call) -> Obj:
    args = {k: v for k, v in call.args.items() if k != "token"}
    if args.get("error"):
        raise ApiError(str(args["error"]), extra={"args": args})
    return {"ok": True, "args": args}


def auth_test(call: Call) -> Obj:
    return {"ok": True, "url": TEAM_URL, "team": TEAM_NAME, "user": BOT_NAME,
            "team_id": TEAM_ID, "user_id": BOT_USER, "bot_id": BOT_ID,
            "is_enterprise_install": False}


def apps_connections_open(call: Call) -> Obj:
    ticket = call.journal.new_ticket()
    return {"ok": True, "url": f"ws://{call.host}/socket?ticket={ticket}&app_id={APP_ID}"}


def chat_post_message(call: Call) -> Obj:
    cid = resolve(call, names=True, users=True)
    if BOT_USER not in call.ws.members(cid):
        raise ApiError("not_in_channel")
    c = content(call.args, seed_of(call))
    if not has_content(c):
        raise ApiError("no_text")
    if c.get("blocks") and not c.get("text"):
        c["text"] = BLOCKS_ONLY_TEXT
    thread_ts = text_arg(call.args, "thread_ts") or None
    m = call.ws.post(cid, c, thread_ts=thread_ts,
                     reply_broadcast=flag(call.args.get("reply_broadcast")))
    return {"ok": True, "channel": cid, "ts": m["ts"], "message": api_message(m)}


def chat_update(call: Call) -> Obj:
    required(call.args, "channel", "ts")
    cid = call.ws.resolve(text_arg(call.args, "channel"), names=False, users=False)
    if cid is None:
        raise ApiError("channel_not_found")
    found = call.ws.find(cid, text_arg(call.args, "ts"))
    if found is None:
        raise ApiError("message_not_found")
    m = found[0]
    if m["user"] != BOT_USER:
        raise ApiError("cant_update_message")
    c = content(call.args, seed_of(call))
    if not any(k in c for k in ("text", "blocks", "attachments")):
        raise ApiError("no_text")
    call.ws.update(m, c)
    if m.get("blocks") and not m.get("text"):
        m["text"] = BLOCKS_ONLY_TEXT
    message = api_message(m)
    message.pop("ts", None)
    return {"ok": True, "channel": cid, "ts": m["ts"], "text": m.get("text", ""),
            "message": message}


def chat_delete(call: Call) -> Obj:
    required(call.args, "channel", "ts")
    cid = call.ws.resolve(text_arg(call.args, "channel"), names=False, users=False)
    if cid is None:
        raise ApiError("channel_not_found")
    found = call.ws.find(cid, text_arg(call.args, "ts"))
    if found is None:
        raise ApiError("message_not_found")
    if found[0]["user"] != BOT_USER:
        raise ApiError("cant_delete_message")
    call.ws.delete(found[0])
    return {"ok": True, "channel": cid, "ts": found[0]["ts"]}


def chat_post_ephemeral(call: Call) -> Obj:
    required(call.args, "channel", "user")
    cid = call.ws.resolve(text_arg(call.args, "channel"), names=True, users=False)
    if cid is None:
        raise ApiError("channel_not_found")
    members = call.ws.members(cid)
    if BOT_USER not in members:
        raise ApiError("not_in_channel")
    user = text_arg(call.args, "user")
    if user not in members:
        raise ApiError("user_not_in_channel")
    c = content(call.args, seed_of(call))
    if not has_content(c):
        raise ApiError("no_text")
    if c.get("blocks") and not c.get("text"):
        c["text"] = BLOCKS_ONLY_TEXT
    e = call.ws.post_ephemeral(cid, user, c, text_arg(call.args, "thread_ts") or None)
    return {"ok": True, "message_ts": e["ts"]}


def chat_get_permalink(call: Call) -> Obj:
    required(call.args, "channel", "message_ts")
    cid = call.ws.resolve(text_arg(call.args, "channel"), names=False, users=False)
    if cid is None:
        raise ApiError("channel_not_found")
    found = call.ws.find(cid, text_arg(call.args, "message_ts"))
    if found is None:
        raise ApiError("message_not_found")
    m, parent = found
    link = f"{TEAM_URL}archives/{cid}/p{m['ts'].replace('.', '')}"
    if parent is not None:
        link += f"?thread_ts={parent['ts']}&cid={cid}"
    return {"ok": True, "channel": cid, "permalink": link}


def conversations_info(call: Call) -> Obj:
    cid = resolve(call, names=False, users=False)
    if cid in CHANNELS:
        obj = channel_object(cid, include_num_members=flag(call.args.get("include_num_members")))
    else:
        obj = call.ws.conversation(cid) or {}
    if flag(call.args.get("include_locale")):
        obj["locale"] = "en-US"
    return {"ok": True, "channel": obj}


def _limit(call: Call, default: int) -> int:
    try:
        limit = int(text_arg(call.args, "limit") or default)
    except ValueError:
        raise ApiError("invalid_limit") from None
    return max(1, min(limit, 999)) if limit else default


def conversations_history(call: Call) -> Obj:
    cid = resolve(call, names=False, users=False)
    if BOT_USER not in call.ws.members(cid):
        raise ApiError("not_in_channel")
    with call.ws.lock:
        live = [m for m in call.ws.messages.get(cid, []) if not m.get("deleted")]
        newest_first = [api_message(m) for m in reversed(live)]
    limit = _limit(call, 100)
    return {"ok": True, "messages": newest_first[:limit], "has_more": len(newest_first) > limit,
            "pin_count": 0, "channel_actions_ts": None, "channel_actions_count": 0,
            "response_metadata": {"next_cursor": ""}}


def conversations_replies(call: Call) -> Obj:
    required(call.args, "channel", "ts")
    cid = resolve(call, names=False, users=False)
    if BOT_USER not in call.ws.members(cid):
        raise ApiError("not_in_channel")
    found = call.ws.find(cid, text_arg(call.args, "ts"))
    if found is None:
        raise ApiError("thread_not_found")
    parent = found[1] or found[0]
    with call.ws.lock:
        thread = [api_message(parent)] + [api_message(r) for r in parent.get("replies", [])
                                          if not r.get("deleted")]
    limit = _limit(call, 1000)
    return {"ok": True, "messages": thread[:limit], "has_more": len(thread) > limit,
            "response_metadata": {"next_cursor": ""}}


def users_info(call: Call) -> Obj:
    required(call.args, "user")
    uid = text_arg(call.args, "user")
    if uid not in PEOPLE and uid != BOT_USER:
        raise ApiError("user_not_found")
    user = user_object(uid)
    if flag(call.args.get("include_locale")):
        user["locale"] = "en-US"
    return {"ok": True, "user": user}


def users_list(call: Call) -> Obj:
    members = [user_object(u) for u in [*PEOPLE, BOT_USER]]
    return {"ok": True, "members": members, "cache_ts": int(call.ws.clock // 1_000_000),
            "response_metadata": {"next_cursor": ""}}


def usergroups_list(call: Call) -> Obj:
    groups = [usergroup_object(s, flag(call.args.get("include_users")),
                               flag(call.args.get("include_count"))) for s in USERGROUPS]
    return {"ok": True, "usergroups": groups}


def usergroups_users_list(call: Call) -> Obj:
    required(call.args, "usergroup")
    sid = text_arg(call.args, "usergroup")
    if sid not in USERGROUPS:
        raise ApiError("no_such_subteam")
    return {"ok": True, "users": list(USERGROUPS[sid]["users"])}


Handler = Callable[[Call], Obj]
# method: (handler, token kinds allowed; None = no token needed)
METHODS: dict[str, tuple[Handler, frozenset[str] | None]] = {
    "api.test": (api_test, None),
    "auth.test": (auth_test, frozenset({"bot"})),
    "apps.connections.open": (apps_connections_open, frozenset({"app"})),
    "chat.postMessage": (chat_post_message, frozenset({"bot"})),
    "chat.update": (chat_update, frozenset({"bot"})),
    "chat.delete": (chat_delete, frozenset({"bot"})),
    "chat.postEphemeral": (chat_post_ephemeral, frozenset({"bot"})),
    "chat.getPermalink": (chat_get_permalink, frozenset({"bot"})),
    "conversations.info": (conversations_info, frozenset({"bot"})),
    "conversations.history": (conversations_history, frozenset({"bot"})),
    "conversations.replies": (conversations_replies, frozenset({"bot"})),
    "users.info": (users_info, frozenset({"bot"})),
    "users.list": (users_list, frozenset({"bot"})),
    "usergroups.list": (usergroups_list, frozenset({"bot"})),
    "usergroups.users.list": (usergroups_users_list, frozenset({"bot"})),
}


def authorize(call: Call) -> Handler:
    """The method's handler once the call may run: unknown_method first, then the token,
    then the bot token's scopes."""
    entry = METHODS.get(call.method)
    if entry is None:
        raise ApiError("unknown_method", extra={"req_method": call.method})
    handler, kinds = entry
    if kinds is not None:
        if call.token == "none":
            raise ApiError("not_authed")
        if call.token == "invalid":
            raise ApiError("invalid_auth")
        if call.token not in kinds:
            raise ApiError("not_allowed_token_type")
    lacking = scopes.missing(call.method, call.scopes) if call.token == "bot" else None
    if lacking is not None:
        raise ApiError("missing_scope", extra=lacking)
    return handler
