"""What an HTTP request must pass before its route runs: the size of its body, and for
POST /alerts the bearer token (RUNBOOK_ALERTS_TOKEN or ``server.alerts_token_file``).

Plain functions of header values and the configuration, so that any HTTP server can call
them. The token is never logged, echoed or put in an exception's message.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bot.config import ServerConfig

MAX_BODY = 1024 * 1024  # bytes: the largest request body taken (Alertmanager's 200 alerts fit)
TOKEN_ENV = "RUNBOOK_ALERTS_TOKEN"
MIN_TOKEN_LENGTH = 16
# RFC 6750's b64token: what a bearer token may hold, so that it survives any HTTP client
_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
_DIGITS = re.compile(r"[0-9]+")


class BodyRefused(ValueError):
    """The request's Content-Length is missing, not a number, or out of bounds."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def content_length(value: str | None) -> int:
    """The body's size from the Content-Length header: ASCII digits only, 1 to MAX_BODY.

    Raises BodyRefused with 400 (missing, empty, not a number) or 413 (too large)."""
    text = (value or "").strip()
    if not _DIGITS.fullmatch(text):
        raise BodyRefused(400, "Content-Length must be the body's size in bytes, 1 to "
                               f"{MAX_BODY}" + (" (it was missing)" if not text else ""))
    length = int(text)
    if length == 0:
        raise BodyRefused(400, f"the body must be 1 to {MAX_BODY} bytes; it was empty")
    if length > MAX_BODY:
        raise BodyRefused(413, f"the body must be 1 to {MAX_BODY} bytes; it was {length}")
    return length


class AlertsAuthError(Exception):
    """``runbook serve`` must not start: /alerts would be open to the network, or its token
    cannot be read. The message says what to set."""


@dataclass(frozen=True)
class AlertsAccess:
    """How POST /alerts is guarded: ``tokens`` empty means not at all (``warning`` says so).
    Two tokens while one is being rotated: both are taken."""

    tokens: tuple[str, ...] = field(repr=False)
    warning: str | None = None

    @property
    def token(self) -> str | None:
        """The first token (the one in use), None when /alerts is not guarded."""
        return self.tokens[0] if self.tokens else None


def is_loopback(host: str) -> bool:
    """Whether ``host`` only listens on this machine: 127.0.0.0/8, ::1 or localhost. A name
    (which could resolve anywhere), "" and 0.0.0.0 are not."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def read_tokens(server: ServerConfig, env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The /alerts tokens: RUNBOOK_ALERTS_TOKEN, else ``server.alerts_token_file``'s content
    (whitespace around it dropped, as Alertmanager drops it from credentials_file); none
    when neither is set. Two tokens, separated by white space (one per line in the file), are
    both taken: the old and the new while the token is rotated."""
    env = os.environ if env is None else env
    value = (env.get(TOKEN_ENV) or "").strip()
    where = TOKEN_ENV
    if not value and server.alerts_token_file is not None:
        where = f"server.alerts_token_file ({server.alerts_token_file})"
        try:
            value = server.alerts_token_file.read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or "not text"
            raise AlertsAuthError(f"cannot read {where}: {reason}") from None
        if not value:
            raise AlertsAuthError(f"{where} is empty: put the /alerts token in it")
    tokens = tuple(value.split())
    if len(tokens) > 2:
        raise AlertsAuthError(f"{where} holds {len(tokens)} tokens: one, or two while rotating")
    for token in tokens:
        if len(token) < MIN_TOKEN_LENGTH or not _TOKEN.fullmatch(token):
            raise AlertsAuthError(
                f"the /alerts token of {where} must be at least {MIN_TOKEN_LENGTH} characters "
                "of letters, digits and -._~+/ (a bearer token), e.g. from `openssl rand -hex "
                "32`")
    return tokens


def alerts_access(server: ServerConfig, host: str,
                  env: Mapping[str, str] | None = None) -> AlertsAccess:
    """How ``runbook serve`` on ``host`` guards POST /alerts; AlertsAuthError when it must not
    start (no token on a non-loopback address, or a token that cannot be read)."""
    tokens = read_tokens(server, env)
    if server.alerts_auth == "none":
        if tokens:
            raise AlertsAuthError(f"server.alerts_auth is none but {TOKEN_ENV} is set: unset "
                                  "it, or remove alerts_auth: none to require the token")
        return AlertsAccess((), "POST /alerts takes alerts from anyone who reaches "
                                  f"{host or 'this machine'} (server.alerts_auth: none)")
    if tokens:
        return AlertsAccess(tokens)
    if is_loopback(host):
        return AlertsAccess((), f"POST /alerts is not authenticated: no {TOKEN_ENV} or "
                                  "server.alerts_token_file; anyone on this machine may post "
                                  "alerts")
    raise AlertsAuthError(
        f"POST /alerts on {host or 'every address'} would take alerts from anyone who reaches "
        f"the port: set {TOKEN_ENV} (or server.alerts_token_file) to a token and give "
        "Alertmanager the same one (webhook_config http_config.authorization.credentials_file),"
        " or set server.alerts_auth: none if something in front of the bot authenticates")


def bearer_problem(headers: Mapping[str, str], tokens: str | Sequence[str]) -> str | None:
    """Why the request's ``authorization`` header (keys lower case) is not ``Bearer <token>``
    with one of ``tokens``, or None when it is. Compared in constant time with every token;
    the answer never holds what was sent."""
    scheme, _, given = headers.get("authorization", "").strip().partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return "POST /alerts needs the header Authorization: Bearer <token>"
    sent = given.strip().encode("utf-8", "replace")
    taken = [hmac.compare_digest(sent, token.encode())
             for token in ((tokens,) if isinstance(tokens, str) else tokens)]
    return None if any(taken) else "the bearer token is not the one this bot takes"
