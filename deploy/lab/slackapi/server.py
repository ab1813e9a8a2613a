"""HTTP front: the Web API under /api/, Socket Mode at /socket, response URLs and the lab's
control endpoints under /_lab/."""
from __future__ import annotations

import email.parser
import email.policy
import json
import logging
import re
import secrets
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from . import methods, responses
from .journal import FaultError, Journal, scrub
from .methods import ApiError, Call
from .websocket import TEXT, WebSocket, accept_key, valid_key
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

log = logging.getLogger("slackapi")
Obj = dict[str, Any]
ENVELOPE_TYPES = ("slash_commands", "interactive", "events_api")
BOT_SCOPES = ("chat:write,commands,users:read,users:read.email,usergroups:read,channels:read,"
              "groups:read,im:read,im:write,channels:history")
ARG_NAME = re.compile(r"^[A-Za-z0-9_]{1,64}$")
SAVE_EVERY = 1.0


@dataclass(frozen=True)
class Tokens:
    bot: str
    app: str

    def kind(self, value: str | None) -> str:
        if not value:
            return "none"
        if secrets.compare_digest(value.encode(), self.bot.encode()):
            return "bot"
        if secrets.compare_digest(value.encode(), self.app.encode()):
            return "app"
        return "invalid"


# --- Socket Mode connections ---------------------------------------------------------

@dataclass
class Connection:
    id: int
    ws: WebSocket
    connected_at: float
    remote: str
    draining: bool = False  # sent Slack's `disconnect`: no new envelopes go there

    def view(self) -> Obj:
        return {"id": self.id, "connected_at": self.connected_at, "remote": self.remote,
                "draining": self.draining}


class SocketHub:
    """Open Socket Mode connections. Like Slack, an envelope goes to one connection (in
    turn when there are several), unless the lab asks for every connection; a connection
    that was sent a `disconnect` message gets no more envelopes."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.connections: dict[int, Connection] = {}
        self.seq = 0
        self.turn = 0

    def add(self, ws: WebSocket, remote: str) -> Connection:
        with self.cond:
            self.seq += 1
            conn = Connection(self.seq, ws, time.time(), remote)
            self.connections[conn.id] = conn
            self.cond.notify_all()
            return conn

    def remove(self, conn: Connection) -> None:
        with self.cond:
            self.connections.pop(conn.id, None)
            self.cond.notify_all()

    def open(self) -> list[Connection]:
        with self.cond:
            return [c for c in self.connections.values() if not c.ws.closed]

    def ready(self) -> list[Connection]:
        with self.cond:
            return [c for c in self.connections.values() if not c.ws.closed and not c.draining]

    def wait(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        with self.cond:
            while not self.ready():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return True

    def deliver(self, message: Obj, broadcast: bool) -> list[int]:
        text = json.dumps(message)
        with self.cond:
            conns = self.ready()
            if conns and not broadcast:
                start = self.turn % len(conns)
                conns = conns[start:] + conns[:start]
                self.turn += 1
        sent = []
        for conn in conns:
            try:
                conn.ws.send_text(text)
            except Exception:  # a dying connection: Slack would try another one
                log.info("socket %d: send failed", conn.id)
                continue
            sent.append(conn.id)
            if not broadcast:
                break
        return sent

    def close_all(self) -> None:
        for conn in self.open():
            conn.ws.close(1001, "server shutting down")


# --- the server ------------------------------------------------------------------------

class SlackServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], tokens: Tokens,
                 state_file: Path | None = None) -> None:
        super().__init__(address, Handler)
        self.tokens = tokens
        self.ws = Workspace()
        self.journal = Journal()
        self.hub = SocketHub()
        self.state_file = state_file
        self.dirty = False
        self.stopping = threading.Event()
        if state_file and state_file.exists():
            data = json.loads(state_file.read_text())
            self.ws.load(data.get("workspace", {}))
            self.journal.load(data.get("journal", {}))
        self.saver = threading.Thread(target=self._save_loop, name="saver", daemon=True)
        self.saver.start()

    def touch(self) -> None:
        self.dirty = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up between requests is normal; anything else is logged."""
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError | TimeoutError):
            log.debug("connection from %s ended: %s", client_address, error)
            return
        log.exception("request from %s failed", client_address)

    def save(self) -> None:
        if self.state_file is None or not self.dirty:
            return
        self.dirty = False
        data = {"workspace": self.ws.dump(), "journal": self.journal.dump()}
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.chmod(0o600)
        tmp.replace(self.state_file)

    def _save_loop(self) -> None:
        while not self.stopping.wait(SAVE_EVERY):
            try:
                self.save()
            except OSError:
                log.exception("saving the state failed")

    def stop(self) -> None:
        self.stopping.set()
        self.hub.close_all()
        self.touch()
        self.save()

    def known_tokens(self, extra: str | None = None) -> set[str]:
        return {t for t in (self.tokens.bot, self.tokens.app, extra) if t}


class BadRequest(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def first_values(pairs: list[tuple[str, str]]) -> Obj:
    out: Obj = {}
    for key, value in pairs:
        out.setdefault(key, value)
    return out


def content_type(header: str | None) -> tuple[str, dict[str, str]]:
    if not header:
        return "", {}
    mime, _, rest = header.partition(";")
    params = {}
    for part in rest.split(";"):
        key, _, value = part.strip().partition("=")
        if key:
            params[key.lower()] = value.strip().strip('"')
    return mime.strip().lower(), params


def parse_multipart(header: str, raw: bytes) -> Obj:
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {header}\r\n\r\n".encode() + raw)
    out: Obj = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not name:
            continue
        filename = part.get_filename()
        data = part.get_payload(decode=True)
        if not isinstance(data, bytes):
            data = b""
        if filename:
            out[str(name)] = {"filename": filename, "size": len(data)}
        else:
            out[str(name)] = data.decode(part.get_content_charset() or "utf-8", "replace")
    return out


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: SlackServer
    server_version = "lab-slackapi"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug(format, *args)

    def do_GET(self) -> None:
        self.dispatch()

    do_POST = do_PUT = do_DELETE = do_HEAD = do_GET

    # --- plumbing ------------------------------------------------------------------

    def read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def send_body(self, code: int, data: bytes, ctype: str,
                  headers: dict[str, str] | None = None) -> None:
        self.code = code
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def send_json(self, code: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self.send_body(code, json.dumps(body).encode(), "application/json; charset=utf-8",
                       headers)

    def send_text(self, code: int, text: str) -> None:
        self.send_body(code, text.encode(), "text/plain; charset=utf-8")

    def host(self) -> str:
        host, port = self.server.server_address[:2]
        return self.headers.get("Host") or f"{host!s}:{port}"

    def dispatch(self) -> None:
        began = time.monotonic()
        self.code = 0
        self.outcome = ""
        url = urlsplit(self.path)
        path = url.path
        shown = path  # never the query: GET /api/... may carry ?token=
        try:
            if path.startswith("/api/"):
                self.web_api(path[len("/api/"):].strip("/"), url.query)
                shown = f"{path} {self.outcome}"
            elif path in ("/socket", "/socket/", "/link", "/link/"):
                self.socket_mode(url.query)
            elif path.startswith("/_lab/"):
                self.control(path[len("/_lab/"):].rstrip("/"), dict(parse_qsl(url.query)))
                if self.command != "GET":
                    self.server.touch()
            else:
                self.read_body()
                self.send_text(404, "404 Not Found\n")
        except BadRequest as exc:
            self.send_json(exc.code, {"ok": False, "error": exc.message})
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception:
            log.exception("request failed: %s %s", self.command, path)
            self.send_json(500, {"ok": False, "error": "fatal_error"})
        log.info("%s %s %s %.0fms", self.command, shown.strip(), self.code or "-",
                 (time.monotonic() - began) * 1000)

    # --- Web API -------------------------------------------------------------------

    def parse_args(self, query: str, raw: bytes) -> tuple[Obj, str, str | None, str | None]:
        """(arguments, transport, form error, warning) as Slack parses a request."""
        args = first_values(parse_qsl(query, keep_blank_values=True))
        transport = "query"
        if not raw:
            return args, transport, None, None
        header = self.headers.get("Content-Type")
        mime, params = content_type(header)
        if not mime:
            return args, transport, "missing_post_type", None
        charset = params.get("charset", "")
        if charset and charset.lower() not in ("utf-8", "utf8", "iso-8859-1"):
            return args, transport, "invalid_charset", None
        encoding = charset or "utf-8"
        if mime == "application/json":
            try:
                body = json.loads(raw.decode(encoding))
            except (ValueError, UnicodeDecodeError):
                return args, "json", "invalid_json", None
            if not isinstance(body, dict):
                return args, "json", "invalid_json", None
            return {**args, **body}, "json", None, None if charset else "missing_charset"
        if mime in ("application/x-www-form-urlencoded", "text/plain"):
            try:
                pairs = parse_qsl(raw.decode(encoding), keep_blank_values=True)
            except (ValueError, UnicodeDecodeError):
                return args, "form", "invalid_form_data", None
            form = first_values(pairs)
            transport = "form"
        elif mime == "multipart/form-data":
            try:
                form = parse_multipart(str(header), raw)
            except Exception:
                return args, "multipart", "invalid_form_data", None
            transport = "multipart"
        else:
            return args, transport, "invalid_post_type", None
        for name in form:
            if name.endswith("]") and "[" in name:
                return args, transport, "invalid_array_arg", None
            if not ARG_NAME.match(name):
                return args, transport, "invalid_arg_name", None
        return {**args, **form}, transport, None, None

    def web_api(self, method: str, query: str) -> None:
        began = time.monotonic()
        raw = self.read_body()
        args, transport, form_error, warning = self.parse_args(query, raw)
        # The token: a Bearer Authorization header, else a `token` query/form argument
        # (never one inside a JSON body: Slack wants the header then).
        auth = (self.headers.get("Authorization") or "").strip()
        scheme, _, value = auth.partition(" ")
        token = value.strip() if scheme.lower() == "bearer" else ""
        form_token = args.pop("token", None)
        if not token and transport != "json" and isinstance(form_token, str):
            token = form_token.strip()
        kind = self.server.tokens.kind(token)
        call = Call(method=method, args=args, token=kind, host=self.host(),
                    ws=self.server.ws, journal=self.server.journal)
        status, headers, fault = 200, {"X-Slack-Req-Id": uuid.uuid4().hex}, None
        body: Obj
        try:
            if form_error:
                raise ApiError(form_error)
            handler = methods.authorize(call)
            fault = self.server.journal.take_fault(method)
            if fault and fault["kind"] == "delay":
                time.sleep(fault["delay"])
            if fault and fault["kind"] == "ratelimit":
                status, body = 429, {"ok": False, "error": "ratelimited"}
                headers["Retry-After"] = str(fault["retry_after"])
            elif fault and fault["kind"] == "error":
                body = {"ok": False, "error": fault["error"]}
            elif fault and fault["kind"] == "status":
                status = fault["status"]
                body = {"ok": False, "error": "service_unavailable" if status == 503
                        else "internal_error"}
            else:
                body = handler(call)
        except ApiError as exc:
            body = exc.body()
        if warning:
            body["warning"] = warning
            body.setdefault("response_metadata", {}).setdefault("warnings", []).append(warning)
        if kind == "bot":
            headers["X-OAuth-Scopes"] = BOT_SCOPES
        tokens = self.server.known_tokens(token)
        self.server.journal.record_call({
            "time": time.time(), "method": method, "http_method": self.command,
            "transport": transport, "args": scrub(args, tokens), "token": kind,
            "token_valid": kind in ("bot", "app"), "status": status,
            "ok": bool(body.get("ok")), "error": body.get("error"),
            "fault": fault["kind"] if fault else None,
            "response": scrub(body, tokens),
            "duration_ms": round((time.monotonic() - began) * 1000, 1),
        })
        self.server.touch()
        self.outcome = f"{'ok' if body.get('ok') else body.get('error')} ({kind} token)"
        self.send_json(status, body, headers)

    # --- Socket Mode ---------------------------------------------------------------

    def socket_mode(self, query: str) -> None:
        args = dict(parse_qsl(query))
        if self.command != "GET":
            raise BadRequest(405, "method_not_allowed")
        upgrade = (self.headers.get("Upgrade") or "").lower()
        connection = (self.headers.get("Connection") or "").lower()
        if upgrade != "websocket" or "upgrade" not in connection:
            raise BadRequest(400, "expected a WebSocket upgrade")
        if self.headers.get("Sec-WebSocket-Version") != "13":
            self.send_body(426, b"", "text/plain", {"Sec-WebSocket-Version": "13"})
            return
        key = self.headers.get("Sec-WebSocket-Key")
        if not valid_key(key):
            raise BadRequest(400, "invalid Sec-WebSocket-Key")
        if not self.server.journal.known_ticket(args.get("ticket")):
            raise BadRequest(401, "invalid_ticket")
        self.code = 101
        self.send_response(101, "Switching Protocols")
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept_key(str(key).strip()))
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        ws = WebSocket(self.connection, self.rfile)
        conn = self.server.hub.add(ws, f"{self.client_address[0]}:{self.client_address[1]}")
        log.info("socket %d: connected (%d open)", conn.id, len(self.server.hub.open()))
        try:
            ws.send_text(json.dumps({
                "type": "hello", "num_connections": len(self.server.hub.open()),
                "debug_info": {"host": "applink-lab", "build_number": 1,
                               "approximate_connection_time": 18060},
                "connection_info": {"app_id": APP_ID}}))
            while True:
                received = ws.receive()
                if received is None:
                    break
                opcode, data = received
                if opcode == TEXT:
                    self.client_message(conn, data.decode())
        finally:
            self.server.hub.remove(conn)
            ws.shutdown()
            log.info("socket %d: closed (code %s)", conn.id, ws.close_code)

    def client_message(self, conn: Connection, text: str) -> None:
        try:
            message = json.loads(text)
        except ValueError:
            log.info("socket %d: not JSON: %.200s", conn.id, text)
            return
        if not isinstance(message, dict) or "envelope_id" not in message:
            log.info("socket %d: not an ack: %.200s", conn.id, text)
            return
        journal = self.server.journal
        payload = message.get("payload")
        ack = journal.record_ack(message["envelope_id"], payload, conn.id)
        sent = journal.envelope(str(message["envelope_id"]))
        rid = sent.get("response_id") if sent else None
        if rid and payload:
            record, _ = journal.use_response(rid, payload, "ack")
            if record:
                responses.apply(self.server.ws, record, responses.as_body(payload), "ack")
        self.server.touch()
        log.info("socket %d: ack %s%s", conn.id, message["envelope_id"],
                 "" if ack["known"] else " (unknown envelope)")

    # --- control ---------------------------------------------------------------------

    def json_body(self) -> Any:
        raw = self.read_body()
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError:
            raise BadRequest(400, "the body must be JSON") from None

    def control(self, path: str, query: dict[str, str]) -> None:
        srv, verb = self.server, self.command
        journal, ws = srv.journal, srv.ws
        if path == "health":
            self.send_json(200, {"ok": True, "clients": len(srv.hub.open())})
        elif path == "workspace" and verb == "GET":
            self.send_json(200, workspace_view())
        elif path == "calls" and verb == "GET":
            calls = journal.list_calls(query.get("method"))
            since = int(query.get("since") or 0)
            self.send_json(200, [c for c in calls if c["id"] > since])
        elif path == "calls" and verb == "DELETE":
            with journal.lock:
                journal.calls = []
            self.send_json(200, {"ok": True})
        elif path == "messages" and verb == "GET":
            self.send_json(200, messages_view(ws, query.get("channel")))
        elif path == "faults" and verb == "GET":
            self.send_json(200, journal.list_faults())
        elif path == "faults" and verb == "POST":
            try:
                fault = journal.arm(self.json_body())
            except FaultError as exc:
                raise BadRequest(400, str(exc)) from None
            self.send_json(200, {"ok": True, "fault": fault})
        elif path == "faults" and verb == "DELETE":
            journal.clear_faults()
            self.send_json(200, {"ok": True})
        elif path == "reset" and verb == "POST":
            ws.reset()
            journal.reset()
            self.send_json(200, {"ok": True})
        elif path == "responses" and verb == "GET":
            self.send_json(200, journal.list_responses())
        elif path == "responses" and verb == "POST":
            self.register_response()
        elif path.startswith("response/"):
            self.response_url(path[len("response/"):])
        elif path == "socket/send" and verb == "POST":
            self.socket_send()
        elif path == "socket/acks" and verb == "GET":
            self.send_json(200, journal.list_acks(query.get("envelope_id")))
        elif path == "socket/acks" and verb == "DELETE":
            with journal.lock:
                journal.acks = []
            self.send_json(200, {"ok": True})
        elif path == "socket/envelopes" and verb == "GET":
            with journal.lock:
                self.send_json(200, journal.envelopes)
        elif path == "socket/clients" and verb == "GET":
            conns = srv.hub.open()
            self.send_json(200, {"clients": len(conns), "ready": len(srv.hub.ready()),
                                 "connections": [c.view() for c in conns]})
        elif path == "socket/disconnect" and verb == "POST":
            self.socket_disconnect()
        elif path == "socket/close" and verb == "POST":
            # Drop every connection without Slack's `disconnect` message first (a network
            # cut, a server restart): close frame with the given code.
            body = self.json_body()
            conns = srv.hub.open()
            for conn in conns:
                conn.ws.close(int(body.get("code") or 1001), str(body.get("reason") or ""))
            self.send_json(200, {"ok": True, "connections": [c.id for c in conns]})
        else:
            self.read_body()
            raise BadRequest(404, f"no lab endpoint {verb} /_lab/{path}")

    def response_base(self) -> str:
        return f"http://{self.host()}/_lab/response/"

    def register_response(self) -> None:
        body = self.json_body()
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
        record = self.server.journal.register_response(ctx, body.get("ttl"),
                                                       body.get("max_uses"))
        self.send_json(200, {"ok": True, "id": record["id"],
                             "url": self.response_base() + record["id"]})

    def response_url(self, rest: str) -> None:
        rid, _, sub = rest.partition("/")
        journal = self.server.journal
        if self.command == "GET" and not sub:
            record = journal.response(rid)
            if record is None:
                raise BadRequest(404, "no_service")
            self.send_json(200, record)
            return
        if self.command != "POST" or sub not in ("", "ack"):
            self.read_body()
            raise BadRequest(405, "method_not_allowed")
        raw = self.read_body()
        mime, _ = content_type(self.headers.get("Content-Type"))
        if mime == "application/x-www-form-urlencoded" and sub == "":
            raw = first_values(parse_qsl(raw.decode(errors="replace"))).get("payload",
                                                                             "").encode()
        body = responses.as_body(raw)
        record, refusal = journal.use_response(rid, body, "ack" if sub else "post")
        if record is None or refusal:
            self.send_json(404, {"ok": False, "error": refusal or "no_service"})
            return
        code, answer = responses.apply(self.server.ws, record, body,
                                       "ack" if sub else "response_url")
        if code == 200:
            self.send_text(200, answer)
        else:
            self.send_body(code, answer.encode(), "application/json; charset=utf-8")

    def socket_send(self) -> None:
        body = self.json_body()
        kind, payload = body.get("type"), body.get("payload")
        if kind not in ENVELOPE_TYPES or not isinstance(payload, dict):
            raise BadRequest(400, f"type must be one of {', '.join(ENVELOPE_TYPES)} "
                             "and payload a JSON object")
        if not self.server.hub.wait(float(body.get("wait") or 0)):
            self.send_json(409, {"ok": False, "error": "no_socket_connection"})
            return
        journal = self.server.journal
        response_id = response_url = None
        interaction = payload.get("type")
        if kind == "slash_commands" or (kind == "interactive" and interaction in
                                        ("block_actions", "message_action", "shortcut")):
            # Slack puts a response_url into these payloads (shortcuts excepted).
            ctx = responses.context(kind, payload)
            response_id = journal.register_response(ctx)["id"]
            response_url = self.response_base() + response_id
            if kind != "interactive" or interaction != "shortcut":
                payload = {**payload}
                payload.setdefault("response_url", response_url)
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
        delivered = self.server.hub.deliver(envelope, bool(body.get("broadcast")))
        if not delivered:
            self.send_json(409, {"ok": False, "error": "no_socket_connection"})
            return
        journal.record_envelope(envelope, delivered)
        if response_id:
            with journal.lock:
                journal.envelopes[-1]["response_id"] = response_id
        self.send_json(200, {"ok": True, "envelope_id": envelope["envelope_id"],
                             "delivered_to": delivered, "response_url": response_url})

    def socket_disconnect(self) -> None:
        body = self.json_body()
        reason = body.get("reason") or "refresh_requested"
        if reason not in ("warning", "refresh_requested", "link_disabled"):
            raise BadRequest(400, "reason must be warning, refresh_requested or link_disabled")
        message = {"type": "disconnect", "reason": reason,
                   "debug_info": {"host": "applink-lab"}}
        conns = self.server.hub.ready()
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
        self.send_json(200, {"ok": True, "connections": [c.id for c in conns]})


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
