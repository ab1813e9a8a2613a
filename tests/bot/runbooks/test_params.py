"""Request parameters (bot.runbooks.params): ``validate`` for every parameter type (node against the
inventory with suggestions, text limits and refusal of shell metacharacters and control
characters, int limits, bool words, durations, enums, versions), unknown and missing parameters,
defaults; ``weakens_guard`` (which values weaken a guard, how they are described, which
markings a runbook may not make); and Hypothesis fuzzing that only ParamError ever escapes
and that accepted nodes and texts are safe. The words themselves: tests/bot/surfaces/chat.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from bot.runbooks.model import ParamSpec, Runbook
from bot.runbooks.params import (
    SHELLISH,
    Duration,
    Inventory,
    ParamError,
    WeakenedGuard,
    jsonable,
    validate,
    weakened_guards,
)
from bot.surfaces.chat.words import parse_assignments, split_words

INVENTORY = Inventory(
    nodes=frozenset({"gpu01", "gpu02", "gpu03", "gpu10", "cpu01"}),
    slurm=frozenset({"gpu01", "gpu02", "gpu03", "gpu10"}),
    kubernetes=frozenset({"gpu03"}),
)


def runbook(**params: dict[str, Any]) -> Runbook:
    return Runbook.model_validate(
        {
            "name": "test-params",
            "version": "1.0.0",
            "summary": "parameters",
            "risk": "low",
            "params": params,
            "steps": [{"id": "a", "action": "chat.notify", "with": {"message": "x"}}],
        }
    )


ALL_TYPES = runbook(
    node={"type": "node", "required": True},
    reason={"type": "text", "max_length": 50},
    count={"type": "int", "min": 1, "max": 8},
    force={"type": "bool", "default": False},
    timeout={"type": "duration", "default": "2h", "min": 1, "max": 86400},
    pool={"type": "enum", "choices": ["train", "serve"]},
    driver={"type": "version"},
)


def one(**spec: Any) -> Runbook:
    return runbook(value=spec)


def ok(spec: Runbook, value: Any) -> Any:
    return validate(spec, {"value": value}, INVENTORY)["value"]


def refused(spec: Runbook, raw: dict[str, Any]) -> list[str]:
    with pytest.raises(ParamError) as caught:
        validate(spec, raw, INVENTORY)
    return caught.value.problems


def refused_value(spec: Runbook, value: Any) -> str:
    found = refused(spec, {"value": value})
    assert len(found) == 1, found
    assert found[0].startswith("value: ")
    return found[0]


# --- validate: node ---------------------------------------------------------------


def test_node_in_the_inventory() -> None:
    assert ok(one(type="node"), "gpu02") == "gpu02"


def test_unknown_node_suggests_close_names() -> None:
    problem = refused_value(one(type="node"), "gpu1")
    assert problem.startswith('value: "gpu1" is not a known node (did you mean ')
    assert "gpu10" in problem and "gpu01" in problem


def test_unknown_node_without_a_close_name() -> None:
    assert refused_value(one(type="node"), "zzzzzz") == 'value: "zzzzzz" is not a known node'


def test_empty_inventory_says_so() -> None:
    with pytest.raises(ParamError) as caught:
        validate(one(type="node"), {"value": "gpu01"}, Inventory())
    assert "the inventory is empty" in caught.value.problems[0]


def test_nodes_are_known_and_compressed() -> None:
    assert ok(one(type="nodes"), "gpu[03,01-02],gpu02") == "gpu[01-03]"
    assert refused_value(one(type="nodes"), "gpu[01-04]") == (
        "value: gpu04: not known node(s) (1 of 4)")


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("gpu[01-06]", "gpu[01-06] names 6 nodes; the inventory holds 5"),
        ("gpu[0-9999]", "gpu[0-9999] names 10,000 nodes; the inventory holds 5"),
        ("gpu[0-99999999]", "gpu[0-99999999] names 100,000,000 nodes; the inventory holds 5"),
        ("gpu[" + ",".join(["0-9999"] * 500) + "]",
         "gpu[" + "0-9999," * 8 + "... (3504 characters) names 10,000 nodes; the inventory "
         "holds 5"),
    ],
)
def test_nodes_beyond_the_inventory_are_refused_from_their_ranges(value: str,
                                                                 problem: str) -> None:
    assert refused_value(one(type="nodes"), value) == f"value: {problem}"


def test_nodes_over_an_empty_inventory_say_so() -> None:
    with pytest.raises(ParamError) as caught:
        validate(one(type="nodes"), {"value": "gpu[01-02]"}, Inventory())
    assert caught.value.problems == ['value: "gpu[01-02]": not known (the inventory is empty)']


@pytest.mark.parametrize(
    "value", ["gpu01;reboot", "gpu01 ", "gpu01\n", "$(id)", "-gpu01", "", "g" * 64, "gpu01/x"]
)
def test_node_names_that_are_not_names(value: str) -> None:
    assert "is not a node name" in refused_value(one(type="node"), value)


# --- validate: text ---------------------------------------------------------------


def test_text_is_kept() -> None:
    assert ok(one(type="text"), "XID 79 on GPU 3 (ticket #42)") == "XID 79 on GPU 3 (ticket #42)"


def test_text_max_length() -> None:
    spec = one(type="text", max_length=5)
    assert ok(spec, "12345") == "12345"
    assert refused_value(spec, "123456") == "value: 6 characters; at most 5"


def test_text_default_limit_is_200() -> None:
    assert "at most 200" in refused_value(one(type="text"), "x" * 201)


@pytest.mark.parametrize(
    "value", ["$(id)", "`id`", "a; reboot", "a | b", "a && b", "x > /etc/passwd", "<x", "a\\b"]
)
def test_text_refuses_shell_metacharacters(value: str) -> None:
    assert "are not allowed" in refused_value(one(type="text"), value)


@pytest.mark.parametrize(
    "char", ["\n", "\t", "\x00", "\x07", "\x1b", "\x7f", "\x85", "\u202e", "\u2028"]
)
def test_text_refuses_control_characters(char: str) -> None:
    problem = refused_value(one(type="text"), f"XID{char}79")
    assert problem == "value: control characters are not allowed"


def test_text_pattern() -> None:
    spec = one(type="text", pattern=r"INC-\d+")
    assert ok(spec, "INC-42") == "INC-42"
    assert "does not match" in refused_value(spec, "INC-42 and more")


# --- validate: int, bool, duration, enum, version -------------------------------------------


def test_int_and_its_limits() -> None:
    spec = one(type="int", min=1, max=8)
    assert ok(spec, " 8 ") == 8
    assert ok(spec, 1) == 1
    assert refused_value(spec, "0") == "value: 0 is below the minimum 1"
    assert refused_value(spec, "9") == "value: 9 is above the maximum 8"
    assert refused_value(spec, "eight") == 'value: "eight" is not a whole number'
    assert "whole number" in refused_value(spec, "1.5")
    assert "whole number" in refused_value(spec, True)


@pytest.mark.parametrize(
    ("word", "expected"),
    [("true", True), ("Yes", True), ("on", True), ("1", True),
     ("false", False), ("NO", False), ("off", False), ("0", False), (True, True)],
)
def test_bool_words(word: Any, expected: bool) -> None:
    assert ok(one(type="bool"), word) is expected


def test_bool_refuses_other_words() -> None:
    assert refused_value(one(type="bool"), "maybe") == 'value: "maybe" is not true or false'


@pytest.mark.parametrize(
    ("text", "seconds"), [("90s", 90), ("30m", 1800), ("2h", 7200), ("1h30m", 5400), ("1d", 86400)]
)
def test_duration_forms(text: str, seconds: float) -> None:
    value = ok(one(type="duration"), text)
    assert isinstance(value, Duration)
    assert value == seconds


def test_duration_limits_are_shown_as_durations() -> None:
    spec = one(type="duration", min=60, max=7200)
    assert refused_value(spec, "30s") == "value: 30s is below the minimum 1m"
    assert refused_value(spec, "3h") == "value: 3h is above the maximum 2h"


@pytest.mark.parametrize("text", ["2 hours", "h", "-5m", "", "1" + "0" * 400 + "s"])
def test_duration_refused(text: str) -> None:
    problem = refused_value(one(type="duration"), text)
    assert "duration" in problem


def test_enum() -> None:
    spec = one(type="enum", choices=["train", "serve"])
    assert ok(spec, "serve") == "serve"
    assert refused_value(spec, "Serve") == 'value: "Serve" is not one of train, serve'


@pytest.mark.parametrize("text", ["550.54.15", "12", "1.2.3.4", "535.104.05-1", "2.0.0+build.7"])
def test_version_accepted(text: str) -> None:
    assert ok(one(type="version"), text) == text


@pytest.mark.parametrize("text", ["v550", "550.54.15\n", "1.2.3.4.5", "latest", "1..2", ""])
def test_version_refused(text: str) -> None:
    assert "is not a version" in refused_value(one(type="version"), text)


# --- validate: the set of parameters ---------------------------------------------------


def test_unknown_parameter_suggests_one() -> None:
    found = refused(ALL_TYPES, {"node": "gpu01", "reasn": "x"})
    assert found == [
        'unknown parameter "reasn" (did you mean "reason"?); test-params takes: '
        "count, driver, force, node, pool, reason, timeout"
    ]


def test_unknown_parameter_for_a_runbook_without_parameters() -> None:
    found = refused(runbook(), {"x": "1"})
    assert found == ['unknown parameter "x"; test-params takes: no parameters']


def test_missing_required_parameter() -> None:
    assert refused(ALL_TYPES, {}) == ["node is required (a node name like gpu07)"]


def test_defaults_are_filled_in() -> None:
    values = validate(ALL_TYPES, {"node": "gpu01"}, INVENTORY)
    assert values == {
        "node": "gpu01", "reason": None, "count": None, "force": False,
        "timeout": 7200, "pool": None, "driver": None,
    }
    assert jsonable(values)["timeout"] == "2h"


def test_all_problems_together() -> None:
    found = refused(ALL_TYPES, {"node": "gpu99", "count": "0", "pool": "x", "extra": "1"})
    assert len(found) == 4


def test_node_with_a_command_is_refused_end_to_end() -> None:
    raw = parse_assignments(split_words('node=gpu01;reboot reason="XID 79"'))
    found = refused(ALL_TYPES, raw)
    assert len(found) == 1
    assert found[0].startswith('node: "gpu01;reboot" is not a node name')


def test_bad_spec_combinations_are_refused_by_the_model() -> None:
    with pytest.raises(ValueError, match="needs choices"):
        ParamSpec(type="enum")
    with pytest.raises(ValueError, match="only apply to enum"):
        ParamSpec(type="text", choices=["a"])
    with pytest.raises(ValueError, match="cannot have a default"):
        ParamSpec(type="text", required=True, default="x")


# --- weakens_guard: parameters that weaken a guard ------------------------------------------

GUARDED = runbook(
    node={"type": "node", "required": True},
    min_free_gpus={"type": "int", "default": 8, "min": 0, "weakens_guard": "lower",
                   "description": "free GPUs the pool must keep"},
    max_age={"type": "duration", "default": "7d", "weakens_guard": "higher"},
    requeue={"type": "bool", "default": False, "weakens_guard": "changed"},
    timeout={"type": "duration", "default": "2h"},
)


def weakened(raw: dict[str, str]) -> list[WeakenedGuard]:
    return weakened_guards(GUARDED, validate(GUARDED, {"node": "gpu01", **raw}, INVENTORY),
                           INVENTORY)


def test_defaults_and_stronger_values_weaken_nothing() -> None:
    assert weakened({}) == []
    assert weakened({"min_free_gpus": "8", "max_age": "7d", "requeue": "no"}) == []
    assert weakened({"min_free_gpus": "16", "max_age": "1d", "timeout": "1m"}) == []


@pytest.mark.parametrize("raw, param, default, value", [
    ({"min_free_gpus": "0"}, "min_free_gpus", 8, 0),
    ({"min_free_gpus": "7"}, "min_free_gpus", 8, 7),
    ({"max_age": "30d"}, "max_age", "7d", "30d"),
    ({"max_age": "168h1s"}, "max_age", "7d", "7d1s"),
    ({"requeue": "true"}, "requeue", False, True),
])
def test_a_value_past_its_default_weakens_the_guard(raw: dict[str, str], param: str,
                                                    default: Any, value: Any) -> None:
    (found,) = weakened(raw)
    assert (found.param, found.default, found.value) == (param, default, value)


def test_every_weakened_guard_is_named() -> None:
    found = weakened({"min_free_gpus": "0", "requeue": "yes"})
    assert [g.param for g in found] == ["min_free_gpus", "requeue"]
    assert found[0].describe() == ("min_free_gpus=0 weakens a guard (free GPUs the pool must "
                                   "keep): it is lower than its default 8")
    assert found[1].describe() == "requeue=true weakens a guard: it is not its default false"


@pytest.mark.parametrize("spec, message", [
    ({"type": "int", "weakens_guard": "lower"}, "needs a default"),
    ({"type": "int", "required": True, "weakens_guard": "lower"}, "needs a default"),
    ({"type": "bool", "default": False, "weakens_guard": "lower"}, 'use "changed" for a bool'),
    ({"type": "text", "default": "x", "weakens_guard": "higher"}, 'use "changed" for a text'),
    ({"type": "int", "default": 1, "weakens_guard": "below"}, "lower"),
])
def test_weakens_guard_must_make_sense(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ParamSpec.model_validate(spec)


# --- fuzzing ----------------------------------------------------------------------

FUZZ = settings(max_examples=200, deadline=None)


NAMES = st.sampled_from(sorted(ALL_TYPES.params)) | st.text(max_size=6)
VALUES = (
    st.text()
    | st.sampled_from(sorted(INVENTORY.nodes))
    | st.sampled_from(["gpu01;reboot", "$(id)", "`id`", "2h", "1h30m", "5", "true", "train",
                       "550.54.15", "gpu01\n", "XID 79", ""])
)


@FUZZ
@given(st.dictionaries(NAMES, VALUES, max_size=8))
def test_fuzz_validate(raw: dict[str, str]) -> None:
    try:
        values = validate(ALL_TYPES, raw, INVENTORY)
    except ParamError as exc:
        assert exc.problems
        return
    assert values["node"] in INVENTORY.nodes
    if values["reason"] is not None:
        assert not SHELLISH.search(values["reason"])
        assert all(ord(c) >= 0x20 for c in values["reason"])
    assert set(values) == set(ALL_TYPES.params)
