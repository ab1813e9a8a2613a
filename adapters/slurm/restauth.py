"""The JWT slurmrestd wants (X-SLURM-USER-TOKEN): read from a file or a variable, or minted.

A token is renewed shortly before its ``exp``: a file is re-read, a key mints a new one
(HS256 with the site's jwt key, claims ``sun``/``iat``/``exp`` as ``scontrol token``).
Hand-rolled HS256 (hmac + base64): no JWT library. Tokens never appear in messages.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from adapters.slurm.backend import SlurmError
from adapters.slurm.config import RestConfig

MAX_RENEW_BEFORE = 60.0  # seconds before exp a token is renewed (at most; 10% of short lives)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def claims(token: str) -> dict[str, Any]:
    """The JWT's payload, unverified (slurmrestd verifies it); {} when it is no JWT."""
    parts = token.split(".")
    if len(parts) != 3:
        return {}
    try:
        payload = json.loads(_unb64(parts[1]))
    except ValueError:
        return {}
    return payload if isinstance(payload, dict) else {}


def mint(key: bytes, user: str, lifespan: int, now: float) -> str:
    """An HS256 token for ``user`` valid ``lifespan`` seconds from ``now``."""
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    issued = int(now)
    body = {"exp": issued + lifespan, "iat": issued, "sun": user}
    payload = _b64(json.dumps(body, separators=(",", ":")).encode())
    signature = hmac.new(key, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{_b64(signature)}"


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class TokenSource:
    """The current token for ``config.user``, renewed before it expires.

    ``clock`` (epoch seconds) and ``environ`` are injectable for tests.
    """

    def __init__(self, config: RestConfig, clock: Callable[[], float] = time.time,
                 environ: Mapping[str, str] | None = None) -> None:
        self.config = config
        self.user = config.user or ""
        self._clock = clock
        self._environ = environ if environ is not None else os.environ
        self._token: str | None = None
        self._renew_at: float | None = None  # epoch; None: no exp, never renewed

    def headers(self) -> dict[str, str]:
        return {"X-SLURM-USER-NAME": self.user, "X-SLURM-USER-TOKEN": self.token()}

    def token(self) -> str:
        now = self._clock()
        if self._token is None or (self._renew_at is not None and now >= self._renew_at):
            self._token = self._fetch(now)
        return self._token

    def invalidate(self) -> None:
        """Forget the token (slurmrestd refused it): the next call reads or mints anew."""
        self._token = None

    def _fetch(self, now: float) -> str:
        token = self._mint(now) if self.config.key_file else self._read()
        found = claims(token)
        expires = found.get("exp")
        if not isinstance(expires, int | float):
            self._renew_at = None
            return token
        if now >= expires:
            raise SlurmError(
                f"the slurmrestd token from {self._origin()} expired at {_when(expires)} and "
                f"no newer one is there: {self._remedy()}")
        issued = found.get("iat")
        life = expires - issued if isinstance(issued, int | float) else expires - now
        before = self.config.renew_before
        if before is None:
            before = min(MAX_RENEW_BEFORE, 0.1 * max(life, 0))
        # a token that is already inside its renewal window is used, and looked at again
        self._renew_at = max(expires - before, min(now + 1.0, expires))
        return token

    def _mint(self, now: float) -> str:
        path = Path(self.config.key_file or "")
        try:
            key = path.read_bytes()
        except OSError as exc:
            raise SlurmError(f"cannot read the JWT key slurm.rest.key_file {path}: "
                             f"{exc.strerror or exc}") from exc
        if not key:
            raise SlurmError(f"the JWT key slurm.rest.key_file {path} is empty")
        return mint(key, self.user, self.config.token_lifespan, now)

    def _read(self) -> str:
        if self.config.token_file:
            path = Path(self.config.token_file)
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as exc:
                raise SlurmError(f"cannot read the slurmrestd token file {path}: "
                                 f"{exc.strerror or exc}") from exc
        else:
            text = self._environ.get(self.config.token_env or "", "")
        token = text.strip().removeprefix("SLURM_JWT=")  # `scontrol token` prints SLURM_JWT=
        if not token:
            raise SlurmError(f"no slurmrestd token in {self._origin()}: {self._remedy()}")
        return token

    def _origin(self) -> str:
        if self.config.key_file:
            return f"the key {self.config.key_file}"
        if self.config.token_file:
            return f"the file {self.config.token_file}"
        return f"the environment variable {self.config.token_env}"

    def _remedy(self) -> str:
        if self.config.token_env:
            return ("restart the bot with a fresh token, or use slurm.rest.token_file or "
                    "key_file, which are renewed")
        return (f"write a fresh one there (scontrol token username={self.user} "
                "lifespan=SECONDS), or give slurm.rest.key_file")
