"""Socket Mode at /socket (and /link): the WebSocket upgrade for a ticket that
apps.connections.open handed out, Slack's `hello`, then the client's acks. SocketHub holds the
open connections and gives each envelope to one of them."""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from . import responses
from .plumbing import BadRequest
from .websocket import TEXT, WebSocket, accept_key, valid_key
from .workspace import APP_ID

if TYPE_CHECKING:
    from .server import Handler, SlackServer

log = logging.getLogger("slackapi")
Obj = dict[str, Any]
PATHS = ("/socket", "/socket/", "/link", "/link/")


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


# --- one connection ----------------------------------------------------------------------

def upgrade_key(req: Handler, args: dict[str, str]) -> str | None:
    """The Sec-WebSocket-Key of an acceptable upgrade; None when 426 was answered."""
    if req.command != "GET":
        raise BadRequest(405, "method_not_allowed")
    upgrade = (req.headers.get("Upgrade") or "").lower()
    connection = (req.headers.get("Connection") or "").lower()
    if upgrade != "websocket" or "upgrade" not in connection:
        raise BadRequest(400, "expected a WebSocket upgrade")
    if req.headers.get("Sec-WebSocket-Version") != "13":
        req.send_body(426, b"", "text/plain", {"Sec-WebSocket-Version": "13"})
        return None
    key = req.headers.get("Sec-WebSocket-Key")
    if not valid_key(key):
        raise BadRequest(400, "invalid Sec-WebSocket-Key")
    if not req.server.journal.known_ticket(args.get("ticket")):
        raise BadRequest(401, "invalid_ticket")
    return str(key)


def switch(req: Handler, key: str) -> WebSocket:
    """Answer 101 Switching Protocols; the connection is a WebSocket from here on."""
    req.code = 101
    req.send_response(101, "Switching Protocols")
    req.send_header("Upgrade", "websocket")
    req.send_header("Connection", "Upgrade")
    req.send_header("Sec-WebSocket-Accept", accept_key(key.strip()))
    req.end_headers()
    req.wfile.flush()
    req.close_connection = True
    return WebSocket(req.connection, req.rfile)


def hello(hub: SocketHub) -> str:
    return json.dumps({
        "type": "hello", "num_connections": len(hub.open()),
        "debug_info": {"host": "applink-lab", "build_number": 1,
                       "approximate_connection_time": 18060},
        "connection_info": {"app_id": APP_ID}})


def handle(req: Handler, query: str) -> None:
    """GET /socket?ticket=...: upgrade, say hello, then read the client's messages."""
    key = upgrade_key(req, dict(parse_qsl(query)))
    if key is None:
        return
    ws = switch(req, key)
    hub = req.server.hub
    conn = hub.add(ws, f"{req.client_address[0]}:{req.client_address[1]}")
    log.info("socket %d: connected (%d open)", conn.id, len(hub.open()))
    try:
        ws.send_text(hello(hub))
        while True:
            received = ws.receive()
            if received is None:
                break
            opcode, data = received
            if opcode == TEXT:
                client_message(req.server, conn, data.decode())
    finally:
        hub.remove(conn)
        ws.shutdown()
        log.info("socket %d: closed (code %s)", conn.id, ws.close_code)


def client_message(server: SlackServer, conn: Connection, text: str) -> None:
    """An ack: recorded; a slash command's ack payload shows in Slack as its answer."""
    try:
        message = json.loads(text)
    except ValueError:
        log.info("socket %d: not JSON: %.200s", conn.id, text)
        return
    if not isinstance(message, dict) or "envelope_id" not in message:
        log.info("socket %d: not an ack: %.200s", conn.id, text)
        return
    journal = server.journal
    payload = message.get("payload")
    ack = journal.record_ack(message["envelope_id"], payload, conn.id)
    sent = journal.envelope(str(message["envelope_id"]))
    rid = sent.get("response_id") if sent else None
    if rid and payload:
        record, _ = journal.use_response(rid, payload, "ack")
        if record:
            responses.apply(server.ws, record, responses.as_body(payload), "ack")
    server.touch()
    log.info("socket %d: ack %s%s", conn.id, message["envelope_id"],
             "" if ack["known"] else " (unknown envelope)")
