"""The chat grammar's words (bot.surfaces.chat.words): ``split_words`` and ``parse_assignments``
(quotes, missing ``=``, duplicates, over-long values, every problem named), a window's
``runbooks=`` list (``runbook_list``), and Hypothesis fuzzing that only ParamError escapes.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.runbooks.params import ParamError
from bot.surfaces.chat.words import MAX_VALUE, parse_assignments, runbook_list, split_words
from kit.errors import Refused

FUZZ = settings(max_examples=200, deadline=None)


def test_split_words_honours_quotes() -> None:
    words = split_words('run drain-node node=gpu07 reason="XID 79 on GPU 3"')
    assert words == ["run", "drain-node", "node=gpu07", "reason=XID 79 on GPU 3"]
    assert parse_assignments(words[2:]) == {"node": "gpu07", "reason": "XID 79 on GPU 3"}


def test_single_quotes_and_equals_inside_a_value() -> None:
    assert parse_assignments(split_words("reason='a=b c'")) == {"reason": "a=b c"}


def test_unbalanced_quote_is_a_param_error() -> None:
    with pytest.raises(ParamError) as caught:
        split_words('reason="XID 79')
    assert "check the quotes" in caught.value.problems[0]


def test_missing_equals() -> None:
    with pytest.raises(ParamError) as caught:
        parse_assignments(["node=gpu01", "gpu02"])
    assert caught.value.problems == ['"gpu02" is not key=value (for example node=gpu07)']


def test_empty_value_is_kept() -> None:
    assert parse_assignments(["reason="]) == {"reason": ""}


def test_duplicate_keys() -> None:
    with pytest.raises(ParamError) as caught:
        parse_assignments(["node=gpu01", "node=gpu02"])
    assert caught.value.problems == ["node is given twice"]


@pytest.mark.parametrize("key", ["", "1node", "no-de", "node\n", "nöde", "a" * 42])
def test_bad_keys(key: str) -> None:
    with pytest.raises(ParamError) as caught:
        parse_assignments([f"{key}=x"])
    assert "is not a parameter name" in caught.value.problems[0]


def test_ten_thousand_character_value_is_refused() -> None:
    with pytest.raises(ParamError) as caught:
        parse_assignments(["reason=" + "x" * 10_000])
    assert caught.value.problems == [f"reason: the value is 10000 characters; at most {MAX_VALUE}"]


def test_every_problem_is_reported() -> None:
    with pytest.raises(ParamError) as caught:
        parse_assignments(["a", "b=1", "b=2", "-=3"])
    assert len(caught.value.problems) == 3
    assert str(caught.value) == "; ".join(caught.value.problems)


def test_a_runbook_list_reads_each_runbook_with_its_parameters() -> None:
    assert runbook_list('drain-node node=gpu04 reason="f w"; ; resume-node node=gpu04') == [
        ("drain-node", {"node": "gpu04", "reason": "f w"}), ("resume-node", {"node": "gpu04"})]
    assert runbook_list("") == []


@pytest.mark.parametrize("text, message", [
    ('demo reason="x', 'runbooks: "demo reason="x": cannot read the command'),
    ("demo node", 'runbooks: "demo node": "node" is not key=value'),
])
def test_a_runbook_list_that_does_not_read_is_refused(text: str, message: str) -> None:
    with pytest.raises(Refused) as caught:
        runbook_list(text)
    assert str(caught.value).startswith(message)


@FUZZ
@given(st.text())
def test_fuzz_split_and_parse_text(text: str) -> None:
    try:
        result = parse_assignments(split_words(text))
    except ParamError as exc:
        assert exc.problems
        return
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in result.items())


@FUZZ
@given(st.lists(st.text()))
def test_fuzz_parse_word_lists(words: list[str]) -> None:
    try:
        result = parse_assignments(words)
    except ParamError as exc:
        assert exc.problems
        return
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in result.items())
    assert len(result) == len(words)
