"""Driver versions compare number by number (kit.versions), and canonical JSON is the one
encoding every stored hash depends on (kit.canonical): sorted keys, no spaces, UTF-8 kept.
"""

from __future__ import annotations

import pytest

from kit.canonical import canonical
from kit.versions import version_key


@pytest.mark.parametrize(("version", "key"), [
    ("550.54.15", (550, 54, 15)), ("550", (550,)), ("535.104.05", (535, 104, 5))])
def test_a_version_is_its_numbers(version: str, key: tuple[int, ...]) -> None:
    assert version_key(version) == key


def test_versions_sort_by_number_not_by_text() -> None:
    assert version_key("550.127.05") > version_key("550.54.15")  # type: ignore[operator]
    assert "550.127.05" < "550.54.15"  # what comparing the text would get wrong


@pytest.mark.parametrize("text", ["550.54.15-beta", "", "r550", "550..1", "latest"])
def test_a_version_that_is_not_numbers_and_dots_has_no_key(text: str) -> None:
    assert version_key(text) is None


def test_canonical_json_sorts_keys_and_has_no_spaces() -> None:
    assert canonical({"b": [1, 2], "a": {"d": None, "c": "é"}}) == (
        '{"a":{"c":"é","d":null},"b":[1,2]}')
