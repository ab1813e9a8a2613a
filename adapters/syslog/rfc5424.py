"""Audit events as syslog messages: RFC 5424 (``message``) in the octet-counting frames of
RFC 6587 (``frame``), which let a message hold any byte. The MSG is the event as one JSON
object; STRUCTURED-DATA carries its seq and hash, MSGID its kind."""

from __future__ import annotations

import re

from adapters.auditlog import Event

APP_NAME = "gpu-runbook-bot"
# facility 13 "log audit", severity 6 "informational" (RFC 5424, 6.2.1)
PRI = 13 * 8 + 6
_NOT_PRINTABLE = re.compile(r"[^!-~]")


def header_field(value: str, limit: int) -> str:
    """A HOSTNAME, APP-NAME, PROCID or MSGID: printable ASCII without spaces, at most
    ``limit`` characters; "-" (NILVALUE) when nothing is left."""
    return _NOT_PRINTABLE.sub("_", value)[:limit] or "-"


def param_value(value: str) -> str:
    """An SD-PARAM value with ``"``, ``\\`` and ``]`` escaped (RFC 5424, 6.3.3)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("]", "\\]")


def message(event: Event, *, hostname: str, procid: str, sd_id: str) -> bytes:
    """One RFC 5424 message: the event's time (UTC, microseconds), no BOM before the
    UTF-8 JSON, so that the receiver's file holds plain JSON after the header."""
    structured = (f'[{sd_id} seq="{event.seq}" hash="{param_value(event.hash)}" '
                  f'prev_hash="{param_value(event.prev_hash)}"]')
    header = (f"<{PRI}>1 {event.ts} {header_field(hostname, 255)} {APP_NAME} "
              f"{header_field(procid, 128)} {header_field(event.kind, 32)} {structured} ")
    return header.encode("ascii") + event.as_json().encode("utf-8")


def frame(syslog_message: bytes) -> bytes:
    """RFC 6587 octet counting: MSG-LEN SP SYSLOG-MSG."""
    return str(len(syslog_message)).encode("ascii") + b" " + syslog_message
