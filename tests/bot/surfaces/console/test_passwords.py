"""The console's hashed passwords (bot.surfaces.console.passwords): a hash verifies the
password it was made of and nothing else, a changed or malformed hash verifies nothing,
`runbook console hash-password` prints one, and console.basic refuses a password in clear."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from bot.config import ConfigError, ConsoleConfig, load_config
from bot.surfaces.console.passwords import hash_password, verify_password

PASSWORD = "correct horse battery staple"
RUNBOOK = [sys.executable, "-m", "bot"]


@pytest.fixture(scope="module")
def hashed() -> str:
    return hash_password(PASSWORD)


def test_a_hash_verifies_its_password_and_no_other(hashed: str) -> None:
    assert verify_password(PASSWORD, hashed)
    for other in ("", "correct horse battery stapl", PASSWORD + " ", PASSWORD.upper(),
                  "correct horse battery staple\x00", "\x00" + PASSWORD):
        assert not verify_password(other, hashed), other


def test_a_hash_holds_no_password_and_each_is_salted_anew(hashed: str) -> None:
    kind, n, r, p, salt, _ = hashed.split("$")
    assert (kind, n, r, p) == ("scrypt", "16384", "8", "1")
    assert PASSWORD not in hashed and "horse" not in hashed
    again = hash_password(PASSWORD)
    assert again != hashed and again.split("$")[4] != salt
    assert verify_password(PASSWORD, again)


def test_unicode_passwords_round_trip() -> None:
    password = "pässwörd-ünïcödé-密码"
    assert verify_password(password, hash_password(password))
    assert not verify_password("passwörd-ünïcödé-密码", hash_password(password))


def _changed(hashed: str, index: int, value: str) -> str:
    parts = hashed.split("$")
    parts[index] = value
    return "$".join(parts)


def _flip(text: str) -> str:
    """``text`` with its first base64 character changed (still valid base64)."""
    return ("B" if text[0] == "A" else "A") + text[1:]


def test_a_changed_hash_verifies_nothing(hashed: str) -> None:
    salt, digest = hashed.split("$")[4:]
    for changed in (_changed(hashed, 5, _flip(digest)), _changed(hashed, 4, _flip(salt)),
                    _changed(hashed, 1, "8192"), _changed(hashed, 2, "4"),
                    _changed(hashed, 3, "2")):
        assert changed != hashed
        assert not verify_password(PASSWORD, changed), changed


@pytest.mark.parametrize("malformed", [
    "", "scrypt", "scrypt$", "scrypt$$$$$", "bcrypt$16384$8$1$c2FsdA==$ZGlnZXN0",
    "scrypt$16384$8$1$c2FsdA==", "scrypt$16384$8$1$c2FsdA==$ZGlnZXN0$extra",
    "scrypt$x$8$1$c2FsdA==$ZGlnZXN0", "scrypt$16384$8$1$not base64!$ZGlnZXN0",
    "scrypt$16384$8$1$c2FsdA==$", "scrypt$3$8$1$c2FsdA==$ZGlnZXN0",  # N not a power of 2
    "scrypt$-16384$8$1$c2FsdA==$ZGlnZXN0", f"scrypt${10**40}$8$1$c2FsdA==$ZGlnZXN0",
    "scrypt$1048576$8$1$c2FsdA==$ZGlnZXN0",  # 1 GiB of memory: over the limit, refused
    PASSWORD])
def test_a_malformed_hash_verifies_nothing_and_raises_nothing(malformed: str) -> None:
    assert verify_password(PASSWORD, malformed) is False
    assert verify_password("", malformed) is False


def test_console_basic_refuses_a_password_in_clear() -> None:
    with pytest.raises(ValidationError, match="never the password itself"):
        ConsoleConfig.model_validate({"basic": {"alice": PASSWORD}})


def test_the_configuration_file_with_a_password_in_clear_does_not_load(tmp_path: Path,
                                                                       hashed: str) -> None:
    (tmp_path / "bot.yaml").write_text(f"console:\n  basic:\n    alice: '{hashed}'\n"
                                       f"    bob: {PASSWORD}\n")
    with pytest.raises(ConfigError, match=r"console\.basic: .*bob: a password must be the hash"
                       ) as raised:
        load_config(tmp_path / "bot.yaml")
    assert PASSWORD not in str(raised.value)  # what `runbook` prints does not repeat it
    (tmp_path / "bot.yaml").write_text(f"console:\n  basic:\n    alice: '{hashed}'\n")
    assert load_config(tmp_path / "bot.yaml").console.basic == {"alice": hashed}


def test_console_basic_refuses_a_hash_cut_short_or_edited(hashed: str) -> None:
    salt, digest = hashed.split("$")[4:]
    for broken in (hashed.rsplit("$", 1)[0], hashed.rsplit("$", 1)[0] + "$",
                   hashed[:40], hashed + "$", hashed.replace("$16384$", "$x$"),
                   hashed.replace(digest, digest[:8]), hashed.replace(salt, "not base64!"),
                   hashed + " trailing", f" {hashed}"):
        with pytest.raises(ValidationError, match=r"not a whole hash|never the password"):
            ConsoleConfig.model_validate({"basic": {"alice": broken}})


def _hash_password(stdin: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}
    return subprocess.run([*RUNBOOK, "console", "hash-password"], input=stdin, env=env,
                          capture_output=True, text=True, timeout=60)


def test_runbook_console_hash_password_prints_a_hash_that_verifies() -> None:
    done = _hash_password(PASSWORD + "\n")
    assert done.returncode == 0, done.stderr
    printed = done.stdout.strip()
    assert verify_password(PASSWORD, printed) and PASSWORD not in done.stdout + done.stderr
    ConsoleConfig.model_validate({"basic": {"alice": printed}})  # what console.basic takes
    short = _hash_password("too short\n")
    assert short.returncode == 2 and short.stdout == ""
    assert "at least 12 characters" in short.stderr
