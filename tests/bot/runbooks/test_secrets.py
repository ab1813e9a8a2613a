"""bot/runbooks/secrets.py at the level of its functions: which values are sealed, what a
refused request may keep, what opening an execution's secrets refuses."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest

from bot.runbooks.model import Runbook
from bot.runbooks.secrets import (
    CLEAR_WORD,
    Unsealer,
    has_placeholder,
    placeholder,
    scrub_raw,
    seal_values,
    secret_names,
)
from kit.secretbox import SecretBox, SecretKeyProblem

BOX = SecretBox("k" * 40)


def runbook(**params: Any) -> Runbook:
    return Runbook.model_validate({
        "name": "rb", "version": "1.0.0", "summary": "s", "risk": "low",
        "params": {"node": {"type": "node"}, **params},
        "steps": [{"id": "a", "action": "x.y", "with": {}}]})


SECRET = runbook(token={"type": "text", "secret": True}, pw={"type": "text", "secret": True})


def test_only_secret_values_given_are_sealed() -> None:
    assert secret_names(SECRET) == ["token", "pw"]
    values, sealed = seal_values(SECRET, {"node": "gpu01", "token": "t0k", "pw": None}, BOX)
    assert values["node"] == "gpu01" and values["pw"] is None
    assert values["token"] == placeholder("token", BOX.fingerprint("rb", "token", "t0k"))
    assert list(sealed) == ["token"] and BOX.open(sealed["token"]) == "t0k"
    assert has_placeholder(values) and not has_placeholder({"node": "gpu01", "n": 3})
    assert not has_placeholder({"x": "see " + values["token"]})  # whole values only
    plain = runbook()
    assert seal_values(plain, {"node": "gpu01"}, None) == ({"node": "gpu01"}, {})
    assert seal_values(SECRET, {"node": "gpu01", "token": None}, None)[1] == {}
    with pytest.raises(SecretKeyProblem, match=r"secret parameter \(token\)"):
        seal_values(SECRET, {"token": "t0k"}, None)


def test_a_refused_request_keeps_only_declared_clear_values() -> None:
    raw = {"node": "gpu01", "token": "t0k", "tokn": "t0k"}
    assert scrub_raw(SECRET, raw) == {"node": "gpu01", "token": CLEAR_WORD, "tokn": CLEAR_WORD}
    assert scrub_raw(runbook(), raw) == raw  # no secrets: as given
    assert scrub_raw(None, raw) == raw  # an unknown runbook: nothing to go by


def test_opening_refuses_without_the_key_or_the_stored_value() -> None:
    values, sealed = seal_values(SECRET, {"token": "t0k", "pw": "p4ss"}, BOX)
    opened = Unsealer.open(values, sealed, BOX)
    assert opened.clear() == {"token": "t0k", "pw": "p4ss"}
    assert Unsealer.open({"node": "gpu01"}, {}, None).values == {}  # nothing secret: no key
    with pytest.raises(SecretKeyProblem, match="no key"):
        Unsealer.open(values, sealed, None)
    with pytest.raises(SecretKeyProblem, match="the stored value of pw is gone"):
        Unsealer.open(values, {"token": sealed["token"]}, BOX)
    assert Unsealer().mask("t0k") == "t0k" and Unsealer().unseal(values) == values
    assert opened.mask(("t0k", 3, None)) == ["[secret:token]", 3, None]
    assert opened.mask_text("a p4ss b") == "a [secret:pw] b"


def test_every_quoting_of_the_value_is_masked_whole() -> None:
    value = 'it\'s "pw" wörd'
    opened = Unsealer({"[secret:pw:0123456789abcdef]": ("pw", value)})
    forms = [value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1],
             repr(value)[1:-1], shlex.quote(value)]
    assert len(set(forms)) == 5  # each quoting differs for this value
    for form in forms:
        assert opened.mask_text(f"<{form}>") == "<[secret:pw]>", form  # the longest form whole


def test_the_messages_name_the_parameters() -> None:
    values, sealed = seal_values(SECRET, {"token": "t0k", "pw": "p4ss"}, BOX)
    with pytest.raises(SecretKeyProblem) as no_key:
        seal_values(SECRET, {"token": "t0k", "pw": "p4ss"}, None)
    assert "secret parameter (token, pw) and the bot has no key" in str(no_key.value)
    with pytest.raises(SecretKeyProblem) as no_key:
        Unsealer.open(values, sealed, None)
    assert "secret parameter (pw, token) and the bot has no key" in str(no_key.value)
    with pytest.raises(SecretKeyProblem) as gone:
        Unsealer.open(values, {}, BOX)
    assert str(gone.value) == "the stored value of pw, token is gone"


def test_a_quoting_that_holds_the_value_is_masked_whole_not_inside_its_quotes() -> None:
    opened = Unsealer({"[secret:pw:0123456789abcdef]": ("pw", "a b")})
    assert opened.mask_text("run 'a b' then a b") == "run [secret:pw] then [secret:pw]"
