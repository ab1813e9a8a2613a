"""Who is asking the console: a name set by an authenticating proxy (believed only from the
configured proxy addresses), or HTTP basic against hashed passwords. Fails closed: no
identity, no page. Auditors see everything; requesters see executions."""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from bot.config import Config, ConsoleConfig
from bot.surfaces.console.passwords import verify_password

REALM = 'Basic realm="gpu-runbook-bot console", charset="UTF-8"'
MAX_NAME = 128


@dataclass(frozen=True)
class Viewer:
    name: str
    auditor: bool  # role auditor: every execution, the chain, exports of everything


class NotAllowed(Exception):
    """No page for this request: ``status`` 401 (who are you?) or 403 (not for you)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Identities:
    """Answers ``who(headers, client address)``. Basic credentials that verified are
    remembered (by their SHA-256, never in clear) so that each page does not pay scrypt."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._known: OrderedDict[bytes, str] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def console(self) -> ConsoleConfig:
        return self.config.console

    def who(self, headers: Mapping[str, str], client: str | None) -> Viewer:
        """The viewer; raises NotAllowed (401 or 403) with what is wrong."""
        name = self._from_proxy(headers, client)
        if name is None:
            name = self._from_basic(headers)
        return self._viewer(name)

    def _from_proxy(self, headers: Mapping[str, str], client: str | None) -> str | None:
        proxy = self.console.proxy
        if proxy is None or not _trusted(client, proxy.trusted):
            return None  # anybody can send X-Forwarded-User: only the proxy is believed
        header = proxy.user_header if proxy.name_from == "user" else proxy.email_header
        value = headers.get(header.lower(), "").strip()
        if not value:
            if self.console.basic:
                return None
            raise NotAllowed(401, f"the proxy sent no {header} header")
        if "," in value:
            raise NotAllowed(401, f"{header} was sent more than once")
        return _checked(value)

    def _from_basic(self, headers: Mapping[str, str]) -> str:
        if not self.console.basic and self.console.proxy is not None:
            raise NotAllowed(401, "sign in through the site's proxy: a name is believed only "
                                  "from its addresses")
        if not self.console.basic:
            raise NotAllowed(401, "the console has no identity set up: configure "
                                  "console.proxy or console.basic")
        scheme, _, credentials = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "basic" or not credentials.strip():
            raise NotAllowed(401, "sign in with your console name and password")
        key = hashlib.sha256(credentials.strip().encode()).digest()
        with self._lock:
            if key in self._known:
                self._known.move_to_end(key)
                return self._known[key]
        name = self._check_basic(credentials.strip())
        with self._lock:
            self._known[key] = name
            while len(self._known) > 256:
                self._known.popitem(last=False)
        return name

    def _check_basic(self, credentials: str) -> str:
        try:
            name, _, password = base64.b64decode(credentials, validate=True).decode(
                "utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            raise NotAllowed(401, "the Authorization header is not valid basic") from None
        hashed = self.console.basic.get(name)
        if hashed is None or not verify_password(password, hashed):
            raise NotAllowed(401, "wrong name or password")
        return name

    def _viewer(self, name: str) -> Viewer:
        auditor = self.config.matches(name, self.console.auditors)
        if not auditor and not self.config.matches(name, self.config.requesters):
            raise NotAllowed(403, f"{name} is neither an auditor nor a requester of runbooks")
        return Viewer(name, auditor)


def _trusted(client: str | None, networks: list[str]) -> bool:
    if not client:
        return False
    try:
        address = ipaddress.ip_address(client)
    except ValueError:
        return False
    return any(address in ipaddress.ip_network(n, strict=False) for n in networks)


def _checked(name: str) -> str:
    if len(name) > MAX_NAME or not name.isprintable():
        raise NotAllowed(401, f"a name must be at most {MAX_NAME} printable characters")
    return name
