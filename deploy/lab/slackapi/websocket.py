"""WebSocket, server side (RFC 6455), for Socket Mode: handshake, frames, ping/pong, close.

Client frames must be masked (an unmasked one closes the connection with 1002, as the RFC
says); fragmented client messages are put together; messages up to MAX_MESSAGE bytes are
accepted (1009 beyond). The server sends every message as one unmasked frame, as Slack does
(slack_sdk's builtin client does not put fragments together).
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import socket
import struct
import threading
from typing import Protocol

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
CONT, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
MAX_MESSAGE = 16 * 1024 * 1024


def accept_key(key: str) -> str:
    return base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()


def valid_key(key: str | None) -> bool:
    if not key:
        return False
    try:
        return len(base64.b64decode(key.strip(), validate=True)) == 16
    except ValueError:
        return False


class Reader(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


class Closed(Exception):
    """The connection is closed (by either side, or broken)."""


class ProtocolError(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class WebSocket:
    """One accepted connection; `receive` from one thread, `send_*` from any."""

    def __init__(self, sock: socket.socket, reader: Reader) -> None:
        self.sock = sock
        self.reader = reader
        self.send_lock = threading.Lock()
        self.closed = False
        self.close_code: int | None = None

    # --- sending ---------------------------------------------------------------

    def send_frame(self, opcode: int, payload: bytes) -> None:
        n = len(payload)
        if n < 126:
            header = struct.pack("!BB", 0x80 | opcode, n)
        elif n < 65536:
            header = struct.pack("!BBH", 0x80 | opcode, 126, n)
        else:
            header = struct.pack("!BBQ", 0x80 | opcode, 127, n)
        with self.send_lock:
            if self.closed and opcode != CLOSE:
                raise Closed("connection closed")
            try:
                self.sock.sendall(header + payload)
            except OSError as exc:
                self.closed = True
                raise Closed(str(exc)) from None

    def send_text(self, text: str) -> None:
        self.send_frame(TEXT, text.encode())

    def close(self, code: int = 1000, reason: str = "") -> None:
        """Send a close frame (once) and shut the socket down."""
        with self.send_lock:
            if self.closed:
                return
            self.closed = True
            self.close_code = code
            try:
                payload = struct.pack("!H", code) + reason.encode()[:120]
                self.sock.sendall(struct.pack("!BB", 0x80 | CLOSE, len(payload)) + payload)
            except OSError:
                pass
        self.shutdown()

    def shutdown(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    # --- receiving -------------------------------------------------------------

    def _read(self, n: int) -> bytes:
        data = self.reader.read(n) if n else b""
        if len(data) < n:
            raise Closed("connection closed by the client")
        return data

    def _frame(self) -> tuple[bool, int, bytes]:
        b1, b2 = self._read(2)
        fin, rsv, opcode = bool(b1 & 0x80), b1 & 0x70, b1 & 0x0F
        masked, length = bool(b2 & 0x80), b2 & 0x7F
        if rsv:
            raise ProtocolError(1002, "reserved bits set without an extension")
        if not masked:
            raise ProtocolError(1002, "client frames must be masked")
        if length == 126:
            (length,) = struct.unpack("!H", self._read(2))
        elif length == 127:
            (length,) = struct.unpack("!Q", self._read(8))
        if opcode >= 0x8 and (length > 125 or not fin):
            raise ProtocolError(1002, "control frames must be short and unfragmented")
        if length > MAX_MESSAGE:
            raise ProtocolError(1009, "message too big")
        mask = self._read(4)
        data = self._read(length)
        if length:
            # XOR with the repeated 4-byte key, as one big integer operation.
            key = (mask * (length // 4 + 1))[:length]
            data = (int.from_bytes(data, "big") ^ int.from_bytes(key, "big")).to_bytes(
                length, "big")
        return fin, opcode, data

    def receive(self) -> tuple[int, bytes] | None:
        """The next text/binary message; answers pings; None once the client closed."""
        opcode, parts, size = None, [], 0
        try:
            while True:
                fin, op, data = self._frame()
                if op == PING:
                    self.send_frame(PONG, data)
                    continue
                if op == PONG:
                    continue
                if op == CLOSE:
                    code = struct.unpack("!H", data[:2])[0] if len(data) >= 2 else 1000
                    self.close(code if 1000 <= code < 5000 and code not in (1005, 1006)
                               else 1000)
                    return None
                if op in (TEXT, BINARY):
                    if opcode is not None:
                        raise ProtocolError(1002, "new message inside a fragmented one")
                    opcode = op
                elif op == CONT:
                    if opcode is None:
                        raise ProtocolError(1002, "continuation without a message")
                else:
                    raise ProtocolError(1002, f"unknown opcode {op}")
                parts.append(data)
                size += len(data)
                if size > MAX_MESSAGE:
                    raise ProtocolError(1009, "message too big")
                if fin:
                    message = b"".join(parts)
                    if opcode == TEXT:
                        try:
                            message.decode()
                        except UnicodeDecodeError:
                            raise ProtocolError(1007, "text message is not UTF-8") from None
                    return opcode, message
        except ProtocolError as exc:
            self.close(exc.code, exc.reason)
            return None
        except (Closed, OSError, ValueError):
            self.closed = True
            return None
