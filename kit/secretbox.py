"""A site key that fingerprints and encrypts secret values (runbook parameters marked secret).

From one key text (at least 32 characters) two keys are derived: one for keyed fingerprints
(HMAC-SHA256: a plan binds a secret by it, and nobody without the key can test a guess
against it) and one for encryption at rest (Fernet: AES-128-CBC with HMAC-SHA256, so a
changed ciphertext is refused, never decrypted to something else).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Mapping
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

ENV = "RUNBOOK_SECRET_KEY"
MIN_KEY_CHARS = 32
FINGERPRINT_CHARS = 16


class SecretKeyProblem(Exception):
    """No key, an unreadable or short key, or a ciphertext this key cannot open."""


class SecretBox:
    def __init__(self, key_text: str) -> None:
        key = key_text.strip().encode()
        if len(key) < MIN_KEY_CHARS:
            raise SecretKeyProblem(f"the secret key has {len(key)} characters; at least "
                                   f"{MIN_KEY_CHARS} (make one: openssl rand -base64 32)")
        self._fingerprint_key = _derive(key, b"fingerprint")
        self._fernet = Fernet(base64.urlsafe_b64encode(_derive(key, b"encryption")))

    def fingerprint(self, *parts: str) -> str:
        """A keyed fingerprint of ``parts`` (joined with NUL, so parts cannot run together)."""
        text = "\0".join(parts).encode()
        return hmac.new(self._fingerprint_key, text, hashlib.sha256).hexdigest()[
            :FINGERPRINT_CHARS]

    def seal(self, value: str) -> str:
        return self._fernet.encrypt(value.encode()).decode()

    def open(self, sealed: str) -> str:
        try:
            return self._fernet.decrypt(sealed.encode()).decode()
        except InvalidToken:
            raise SecretKeyProblem("a stored secret cannot be decrypted with this key (the key "
                                   "changed, or the stored value was altered)") from None


def _derive(key: bytes, purpose: bytes) -> bytes:
    return hmac.new(key, b"gpu-runbook-bot secret v1 " + purpose, hashlib.sha256).digest()


def load(key_file: Path | None, environ: Mapping[str, str] | None = None) -> SecretBox | None:
    """The site's key: ``RUNBOOK_SECRET_KEY`` wins over ``key_file``; None when neither is
    set. SecretKeyProblem for a file that cannot be read or a key too short."""
    environ = os.environ if environ is None else environ
    text = environ.get(ENV)
    if text is None and key_file is not None:
        try:
            text = key_file.read_text()
        except OSError as exc:
            raise SecretKeyProblem(f"secrets.key_file {key_file}: {exc.strerror}") from None
    return None if text is None else SecretBox(text)
