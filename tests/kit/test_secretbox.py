"""The site key of secret parameters: keyed fingerprints that only the key reproduces and
that keep their parts apart, Fernet at rest that refuses an altered value or another key,
and where the key comes from (the environment wins over the file; none is None)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kit.secretbox import ENV, FINGERPRINT_CHARS, MIN_KEY_CHARS, SecretBox, SecretKeyProblem, load

KEY = "a" * MIN_KEY_CHARS


def test_a_fingerprint_is_the_keys_and_the_values_alone() -> None:
    box = SecretBox(KEY)
    mark = box.fingerprint("rb", "token", "hunter2")
    assert len(mark) == FINGERPRINT_CHARS and int(mark, 16) >= 0
    assert mark == SecretBox(KEY + "\n").fingerprint("rb", "token", "hunter2")  # file newline
    assert mark != SecretBox("b" * MIN_KEY_CHARS).fingerprint("rb", "token", "hunter2")
    assert mark != box.fingerprint("rb", "token", "hunter3")
    assert box.fingerprint("a", "bc") != box.fingerprint("ab", "c")  # parts kept apart
    assert "hunter2" not in mark


def test_sealed_values_open_only_with_the_key_and_unaltered() -> None:
    box = SecretBox(KEY)
    sealed = box.seal("hunter2")
    assert "hunter2" not in sealed and box.open(sealed) == "hunter2"
    assert box.seal("hunter2") != sealed  # a fresh IV each time: equal values do not show
    with pytest.raises(SecretKeyProblem, match="cannot be decrypted"):
        SecretBox("c" * MIN_KEY_CHARS).open(sealed)
    altered = sealed[:-6] + ("A" if sealed[-6] != "A" else "B") + sealed[-5:]
    with pytest.raises(SecretKeyProblem, match="altered"):
        box.open(altered)


def test_a_short_key_is_refused_saying_how_to_make_one() -> None:
    with pytest.raises(SecretKeyProblem, match=f"{MIN_KEY_CHARS - 1} characters; at least "
                                               f"{MIN_KEY_CHARS} .*openssl rand"):
        SecretBox("x" * (MIN_KEY_CHARS - 1) + "   ")
    assert SecretBox("x" * MIN_KEY_CHARS)  # exactly the least is enough


def test_the_environment_wins_over_the_file_and_none_is_none(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_text("f" * 40)
    from_file = load(path, {})
    from_env = load(path, {ENV: "e" * 40})
    assert from_file is not None and from_env is not None
    assert from_file.fingerprint("x") == SecretBox("f" * 40).fingerprint("x")
    assert from_env.fingerprint("x") == SecretBox("e" * 40).fingerprint("x")
    assert load(None, {}) is None
    with pytest.raises(SecretKeyProblem, match=r"secrets.key_file .*missing.*No such file"):
        load(tmp_path / "missing", {})


# Known answers: fingerprints in waiting plans and values sealed before an upgrade of the bot
# must still match and open after it (a changed derivation would void every approval).
KNOWN_KEY = "k" * 40
KNOWN_FINGERPRINT = "49563beff27489e5"  # of ("rb", "token", "t0k")
KNOWN_SEALED = ("gAAAAABrFOBqerShnKtzru4awgvXwyJxrQRtbA_xUP1yCSDEHykakwXuMGyLMdH5SnLdazLeb9sHMO9b8"
                "hIC3KOfM-ebhBwZ4Q==")  # "hunter2"


def test_fingerprints_and_sealed_values_of_an_earlier_version_still_hold() -> None:
    box = SecretBox(KNOWN_KEY)
    assert box.fingerprint("rb", "token", "t0k") == KNOWN_FINGERPRINT
    assert box.open(KNOWN_SEALED) == "hunter2"


def test_a_value_that_cannot_be_opened_is_refused_saying_why() -> None:
    with pytest.raises(SecretKeyProblem) as refused:
        SecretBox("m" * 40).open(KNOWN_SEALED)
    assert str(refused.value) == ("a stored secret cannot be decrypted with this key (the key "
                                  "changed, or the stored value was altered)")


def test_without_a_mapping_the_process_environment_is_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, KNOWN_KEY)
    found = load(None)
    assert found is not None and found.fingerprint("rb", "token", "t0k") == KNOWN_FINGERPRINT
