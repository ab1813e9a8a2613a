"""HTTP plumbing shared by the fake's three areas (Web API, Socket Mode, /_lab/): the error
the lab's own endpoints answer, Content-Type parsing, url-encoded and multipart bodies."""
from __future__ import annotations

import email.parser
import email.policy
from typing import Any

Obj = dict[str, Any]


class BadRequest(Exception):
    """Answered as {"ok": false, "error": message} with the given HTTP status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def first_values(pairs: list[tuple[str, str]]) -> Obj:
    """A repeated field keeps its first value, as Slack reads arguments."""
    out: Obj = {}
    for key, value in pairs:
        out.setdefault(key, value)
    return out


def content_type(header: str | None) -> tuple[str, dict[str, str]]:
    """(mime type in lower case, parameters with lower-case names)."""
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
    """The fields of a multipart/form-data body; a file field becomes {filename, size}."""
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
