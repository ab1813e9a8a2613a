"""Sending audit events to a syslog receiver over TCP, optionally TLS (``SyslogClient``).

TCP syslog has no acknowledgement, so ``send`` makes one: one connection per batch, then a
close of its own side; a receiver closes its side only after reading everything, and one
that closes with data unread resets the connection instead. Anything else is a failure."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import ssl
import struct
import termios
import time
from collections.abc import Sequence

from adapters.auditlog import Accepted, DeliveryError, DestinationSetupError, Event
from adapters.syslog.config import SyslogConfig
from adapters.syslog.rfc5424 import frame, message

_OUTQ = getattr(termios, "TIOCOUTQ", None)  # Linux: bytes the peer has not acknowledged


def tls_context(config: SyslogConfig) -> ssl.SSLContext:
    """Verifies the receiver (``ca_file``, else the system's CAs) and presents the client
    certificate when one is configured."""
    try:
        context = ssl.create_default_context(
            cafile=str(config.ca_file) if config.ca_file else None)
        if config.cert_file and config.key_file:
            context.load_cert_chain(str(config.cert_file), str(config.key_file))
    except (OSError, ssl.SSLError) as exc:
        raise DestinationSetupError(f"syslog TLS files: {exc}") from exc
    return context


class SyslogClient:
    """Delivers batches of events to one receiver; ``send`` raises DeliveryError unless the
    receiver read the whole batch (a batch may then arrive twice, never partly unnoticed)."""

    def __init__(self, config: SyslogConfig) -> None:
        self.config = config
        self.name = config.address
        self._context = tls_context(config) if config.tls else None
        self._hostname = config.hostname or socket.gethostname()
        self._procid = str(os.getpid())

    def close(self) -> None:
        """Nothing stays open between batches."""

    def payload(self, events: Sequence[Event]) -> bytes:
        return b"".join(frame(message(event, hostname=self._hostname, procid=self._procid,
                                      sd_id=self.config.sd_id)) for event in events)

    def send(self, events: Sequence[Event]) -> Accepted:
        data = self.payload(events)
        deadline = time.monotonic() + self.config.timeout_seconds
        try:
            with self._connect() as conn:
                conn.sendall(data)
                _await_close(conn, deadline)
            return Accepted()
        except DeliveryError:
            raise
        except TimeoutError:
            raise DeliveryError(f"{self.name} did not confirm the batch within "
                                f"{self.config.timeout_seconds:g}s") from None
        except ssl.SSLCertVerificationError as exc:
            raise DeliveryError(f"{self.name}: {exc.verify_message}", retryable=False) from exc
        except OSError as exc:
            raise DeliveryError(f"{self.name}: {exc.strerror or exc}") from exc

    def _connect(self) -> socket.socket:
        conn = socket.create_connection((self.config.host, self.config.resolved_port),
                                        timeout=self.config.timeout_seconds)
        if self._context is None:
            return conn
        try:
            return self._context.wrap_socket(
                conn, server_hostname=self.config.server_name or self.config.host)
        except BaseException:
            conn.close()
            raise


def _await_close(conn: socket.socket, deadline: float) -> None:
    """Close our side (TLS: close_notify first) and read until the receiver closes its
    own: then it has read everything, provided it acknowledged every byte."""
    conn.settimeout(max(deadline - time.monotonic(), 0.001))
    if isinstance(conn, ssl.SSLSocket):
        # it may close without a close_notify of its own: the TCP close decides
        with contextlib.suppress(ssl.SSLEOFError, ssl.SSLZeroReturnError):
            conn.unwrap()  # the same socket, plain from here on
    with contextlib.suppress(OSError):  # already closed by the receiver: the check decides
        conn.shutdown(socket.SHUT_WR)
    while True:
        conn.settimeout(max(deadline - time.monotonic(), 0.001))
        if not conn.recv(4096):  # a syslog receiver sends nothing; b"": it closed
            break
    if _unacknowledged(conn):
        raise DeliveryError("the receiver closed the connection before it had all of "
                            "the batch")


def _unacknowledged(conn: socket.socket) -> int:
    if _OUTQ is None:  # not Linux: the orderly close is the only evidence
        return 0
    found = fcntl.ioctl(conn.fileno(), _OUTQ, struct.pack("i", 0))
    return int(struct.unpack("i", found)[0])
