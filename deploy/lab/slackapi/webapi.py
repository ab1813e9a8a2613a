"""The Web API at /api/METHOD: one pipeline for every method. Slack's argument parsing (query,
form, multipart, JSON), the token, methods.authorize (the table methods.METHODS), an armed
fault, the method itself; then the call is recorded without token values, and answered. A
bot-token answer carries X-OAuth-Scopes (the scopes granted), as Slack's do."""
from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from email.message import Message
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from . import methods, scopes
from .journal import scrub
from .methods import ApiError, Call
from .plumbing import content_type, first_values, parse_multipart

if TYPE_CHECKING:
    from .server import Handler

Obj = dict[str, Any]
ARG_NAME = re.compile(r"^[A-Za-z0-9_]{1,64}$")
CHARSETS = ("utf-8", "utf8", "iso-8859-1")


@dataclass
class Args:
    """A request's arguments as Slack reads them."""

    values: Obj
    transport: str  # query | form | multipart | json
    error: str | None = None  # Slack's error for a body it cannot read
    warning: str | None = None  # e.g. missing_charset: answered, with a warning


def parse_args(headers: Message, query: str, raw: bytes) -> Args:
    """The query's arguments, with the body's on top (first value of a repeated name)."""
    args = first_values(parse_qsl(query, keep_blank_values=True))
    if not raw:
        return Args(args, "query")
    header = headers.get("Content-Type")
    mime, params = content_type(header)
    if not mime:
        return Args(args, "query", "missing_post_type")
    charset = params.get("charset", "")
    if charset and charset.lower() not in CHARSETS:
        return Args(args, "query", "invalid_charset")
    encoding = charset or "utf-8"
    if mime == "application/json":
        return json_args(args, raw, encoding, charset)
    if mime in ("application/x-www-form-urlencoded", "text/plain"):
        transport, form = "form", _urlencoded(raw, encoding)
    elif mime == "multipart/form-data":
        transport, form = "multipart", _multipart(str(header), raw)
    else:
        return Args(args, "query", "invalid_post_type")
    if form is None:
        return Args(args, transport, "invalid_form_data")
    for name in form:
        if name.endswith("]") and "[" in name:
            return Args(args, transport, "invalid_array_arg")
        if not ARG_NAME.match(name):
            return Args(args, transport, "invalid_arg_name")
    return Args({**args, **form}, transport)


def json_args(args: Obj, raw: bytes, encoding: str, charset: str) -> Args:
    """A JSON object body; without a charset Slack answers, with a warning."""
    try:
        body = json.loads(raw.decode(encoding))
    except (ValueError, UnicodeDecodeError):
        body = None
    if not isinstance(body, dict):
        return Args(args, "json", "invalid_json")
    return Args({**args, **body}, "json", None, None if charset else "missing_charset")


def _urlencoded(raw: bytes, encoding: str) -> Obj | None:
    try:
        return first_values(parse_qsl(raw.decode(encoding), keep_blank_values=True))
    except (ValueError, UnicodeDecodeError):
        return None


def _multipart(header: str, raw: bytes) -> Obj | None:
    try:
        return parse_multipart(header, raw)
    except Exception:
        return None


def take_token(headers: Message, args: Args) -> str:
    """A Bearer Authorization header, else a `token` query/form argument (never one inside a
    JSON body: Slack wants the header then). The `token` argument leaves the arguments."""
    auth = (headers.get("Authorization") or "").strip()
    scheme, _, value = auth.partition(" ")
    token = value.strip() if scheme.lower() == "bearer" else ""
    form_token = args.values.pop("token", None)
    if not token and args.transport != "json" and isinstance(form_token, str):
        token = form_token.strip()
    return token


# --- faults: what an armed fault answers instead of the method ---------------------------

Answer = tuple[int, Obj, dict[str, str]]  # HTTP status, body, extra headers


def ratelimited(fault: Obj) -> Answer:
    return 429, {"ok": False, "error": "ratelimited"}, {"Retry-After": str(fault["retry_after"])}


def error_answer(fault: Obj) -> Answer:
    return 200, {"ok": False, "error": fault["error"]}, {}


def status_answer(fault: Obj) -> Answer:
    status = fault["status"]
    error = "service_unavailable" if status == 503 else "internal_error"
    return status, {"ok": False, "error": error}, {}


FAULTS: dict[str, Callable[[Obj], Answer]] = {
    "ratelimit": ratelimited,
    "error": error_answer,
    "status": status_answer,
    # "delay" waits, then the method answers
}


def run(call: Call, form_error: str | None) -> tuple[Answer, Obj | None]:
    """(answer, fault taken): the body's error, else methods.authorize's (unknown_method,
    then the token), else an armed fault's, else the method's own."""
    fault = None
    try:
        if form_error:
            raise ApiError(form_error)
        handler = methods.authorize(call)
        fault = call.journal.take_fault(call.method)
        if fault and fault["kind"] == "delay":
            time.sleep(fault["delay"])
        if fault and fault["kind"] in FAULTS:
            return FAULTS[fault["kind"]](fault), fault
        return (200, handler(call), {}), fault
    except ApiError as exc:
        return (200, exc.body(), {}), fault


def record(req: Handler, call: Call, transport: str, token: str, answer: Answer,
           fault: Obj | None, began: float) -> None:
    """The calls log (GET /_lab/calls): the token's kind only, token values scrubbed."""
    status, body, _ = answer
    tokens = req.server.known_tokens(token)
    req.server.journal.record_call({
        "time": time.time(), "method": call.method, "http_method": req.command,
        "transport": transport, "args": scrub(call.args, tokens), "token": call.token,
        "token_valid": call.token in ("bot", "app"), "status": status,
        "ok": bool(body.get("ok")), "error": body.get("error"),
        "fault": fault["kind"] if fault else None,
        "response": scrub(body, tokens),
        "duration_ms": round((time.monotonic() - began) * 1000, 1),
    })


def handle(req: Handler, method: str, query: str) -> str:
    """Answer one Web API call; returns its outcome for the request log."""
    began = time.monotonic()
    args = parse_args(req.headers, query, req.read_body())
    token = take_token(req.headers, args)
    srv = req.server
    call = Call(method=method, args=args.values, token=srv.tokens.kind(token), host=req.host(),
                ws=srv.ws, journal=srv.journal, scopes=frozenset(srv.scopes))
    headers = {"X-Slack-Req-Id": uuid.uuid4().hex}
    answer, fault = run(call, args.error)
    status, body, extra = answer
    headers.update(extra)
    if args.warning:
        body["warning"] = args.warning
        body.setdefault("response_metadata", {}).setdefault("warnings", []).append(args.warning)
    if call.token == "bot":
        headers["X-OAuth-Scopes"] = ",".join(srv.scopes)
        headers["X-Accepted-OAuth-Scopes"] = ",".join(scopes.NEEDED.get(method, ()))
    record(req, call, args.transport, token, answer, fault, began)
    srv.touch()
    req.send_json(status, body, headers)
    return f"{'ok' if body.get('ok') else body.get('error')} ({call.token} token)"
