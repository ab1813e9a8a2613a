"""Hashed passwords for the console's HTTP basic (``console.basic``): scrypt from the standard
library, so a configuration never holds a password, only ``scrypt$N$r$p$salt$hash``."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

_N, _R, _P = 2**14, 8, 1  # about 16 MiB and tens of milliseconds a try: slow to guess


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=_N, r=_R, p=_P, dklen=32)
    return "$".join(["scrypt", str(_N), str(_R), str(_P), _b64(salt), _b64(digest)])


def verify_password(password: str, hashed: str) -> bool:
    """Whether ``password`` is the one ``hashed`` was made of; a malformed hash is False.
    A NUL is refused: scrypt's HMAC pads keys with zeros, so "pw" and "pw\\0" would match."""
    if "\0" in password:
        return False
    try:
        kind, n, r, p, salt, digest = hashed.split("$")
        if kind != "scrypt":
            return False
        expected = base64.b64decode(digest, validate=True)
        found = hashlib.scrypt(password.encode(), salt=base64.b64decode(salt, validate=True),
                               n=int(n), r=int(r), p=int(p), dklen=len(expected),
                               maxmem=64 * 1024 * 1024)
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(found, expected)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()
