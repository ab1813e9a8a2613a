"""HTTP front of the lab's Slack: SlackServer (the state, saved to a file while running) and
Handler, which hands each request to its area: webapi (/api/METHOD), socketmode (/socket) or
control (/_lab/...), and answers a BadRequest or a crash the same way for all three."""
from __future__ import annotations

import json
import logging
import secrets
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from . import control, files, scopes, socketmode, webapi
from .journal import Journal
from .plumbing import BadRequest
from .socketmode import SocketHub
from .workspace import Workspace

log = logging.getLogger("slackapi")
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


# --- the server ------------------------------------------------------------------------

class SlackServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], tokens: Tokens,
                 state_file: Path | None = None, manifest: Path = scopes.MANIFEST) -> None:
        super().__init__(address, Handler)
        self.tokens = tokens
        self.scopes = scopes.bot_scopes(manifest)  # what the bot token was granted
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


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: SlackServer
    server_version = "lab-slackapi"
    code = 0  # the status answered, for the request log

    def log_message(self, format: str, *args: Any) -> None:
        log.debug(format, *args)

    def do_GET(self) -> None:
        self.dispatch()

    do_POST = do_PUT = do_DELETE = do_HEAD = do_GET

    # --- plumbing ------------------------------------------------------------------

    def read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def json_body(self) -> Any:
        raw = self.read_body()
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError:
            raise BadRequest(400, "the body must be JSON") from None

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

    # --- dispatch ------------------------------------------------------------------

    def dispatch(self) -> None:
        began = time.monotonic()
        self.code = 0
        url = urlsplit(self.path)
        shown = url.path  # never the query: GET /api/... may carry ?token=
        try:
            shown = self.route(url.path, url.query)
        except BadRequest as exc:
            self.send_json(exc.code, {"ok": False, "error": exc.message})
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception:
            log.exception("request failed: %s %s", self.command, url.path)
            self.send_json(500, {"ok": False, "error": "fatal_error"})
        log.info("%s %s %s %.0fms", self.command, shown.strip(), self.code or "-",
                 (time.monotonic() - began) * 1000)

    def route(self, path: str, query: str) -> str:
        """Hand the request to its area; returns what the request log shows for it."""
        if path.startswith("/api/"):
            outcome = webapi.handle(self, path[len("/api/"):].strip("/"), query)
            return f"{path} {outcome}"
        if path.startswith(files.UPLOAD_PATH):
            files.upload(self, path[len(files.UPLOAD_PATH):])
        elif path in socketmode.PATHS:
            socketmode.handle(self, query)
        elif path.startswith("/_lab/"):
            control.handle(self, path[len("/_lab/"):].rstrip("/"), dict(parse_qsl(query)))
            if self.command != "GET":
                self.server.touch()
        else:
            self.read_body()
            self.send_text(404, "404 Not Found\n")
        return path
