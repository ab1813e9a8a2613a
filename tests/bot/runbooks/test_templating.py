"""Templates (bot.runbooks.templating): the Jinja2 sandbox blocks access to Python
internals, unknown
names and attributes are errors (StrictUndefined), a single-expression template keeps the
value's native type, ``condition()`` requires a bool, and ``variables()`` names what a
template reads.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.runbooks.templating import (
    TemplateProblem,
    condition,
    condition_variables,
    is_template,
    render,
    variables,
)

CONTEXT: dict[str, Any] = {
    "node": "gpu07",
    "count": 3,
    "force": True,
    "kubernetes": frozenset({"gpu07"}),
    "nodes": frozenset({"gpu07", "gpu08"}),
}


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__ }}",
        "{{ node.__class__.__mro__[1].__subclasses__() }}",
        "x {{ ''.__class__.__mro__ }} y",
        "{{ render.__globals__ }}",
        "{{ count.__add__(1) }}",
        "{{ node.__init__.__globals__ }}",
    ],
)
def test_sandbox_blocks_internals(template: str) -> None:
    with pytest.raises(TemplateProblem) as caught:
        render(template, {**CONTEXT, "render": render})
    assert template in str(caught.value)


def test_unsafe_attribute_message_says_unsafe() -> None:
    with pytest.raises(TemplateProblem, match="unsafe"):
        render("{{ ''.__class__.__mro__ }}", {})


def test_unknown_name_is_an_error_not_an_empty_string() -> None:
    with pytest.raises(TemplateProblem, match="nod"):
        render("{{ nod }}", CONTEXT)
    with pytest.raises(TemplateProblem, match="nod"):
        render("node {{ nod }}", CONTEXT)


def test_unknown_attribute_is_an_error() -> None:
    with pytest.raises(TemplateProblem, match="foo"):
        render("{{ node.foo }}", CONTEXT)


def test_syntax_error_is_a_template_problem() -> None:
    with pytest.raises(TemplateProblem):
        render("{{ node ", CONTEXT)
    with pytest.raises(TemplateProblem):
        variables("{% if %}")


def test_single_expression_keeps_native_types() -> None:
    assert render("{{ count }}", CONTEXT) == 3
    assert isinstance(render("{{ count }}", CONTEXT), int)
    assert render("{{count * 2}}", CONTEXT) == 6
    assert render("{{ force }}", CONTEXT) is True
    assert render("{{ node }}", CONTEXT) == "gpu07"


def test_text_around_an_expression_gives_text() -> None:
    assert render("n={{ count }}", CONTEXT) == "n=3"
    assert render("{{ count }}{{ count }}", CONTEXT) == "33"
    assert render("{% if force %}yes{% endif %}", CONTEXT) == "yes"


def test_render_walks_lists_and_mappings() -> None:
    value = {"nodes": ["{{ node }}", "fixed"], "n": "{{ count }}", "k": 5, "z": None}
    assert render(value, CONTEXT) == {"nodes": ["gpu07", "fixed"], "n": 3, "k": 5, "z": None}


def test_plain_text_is_untouched() -> None:
    assert render("no template here $(id)", {}) == "no template here $(id)"
    assert not is_template("plain")
    assert is_template("{{ x }}") and is_template("{% if x %}{% endif %}")


def test_rendered_values_are_not_re_rendered() -> None:
    assert render("{{ node }}", {"node": "{{ secret }}"}) == "{{ secret }}"


def test_condition_requires_a_bool() -> None:
    assert condition("{{ node in kubernetes }}", CONTEXT) is True
    assert condition("node in nodes and count > 5", CONTEXT) is False
    with pytest.raises(TemplateProblem, match="not true or false"):
        condition("{{ count }}", CONTEXT)
    with pytest.raises(TemplateProblem, match="not true or false"):
        condition("{{ node }}", CONTEXT)


def test_condition_with_an_unknown_name_or_unsafe_access_fails() -> None:
    with pytest.raises(TemplateProblem):
        condition("{{ nod in kubernetes }}", CONTEXT)
    with pytest.raises(TemplateProblem, match="unsafe"):
        condition("{{ ''.__class__ }}", CONTEXT)


def test_condition_must_be_one_expression() -> None:
    with pytest.raises(TemplateProblem, match="one expression"):
        condition("{{ force }} and {{ force }}", CONTEXT)
    with pytest.raises(TemplateProblem, match="one expression"):
        condition_variables("{{ force }} and {{ force }}")


def test_variables() -> None:
    assert variables("{{ node }}-{{ count + 1 }}") == {"node", "count"}
    assert variables("{% for n in nodes %}{{ n }}{% endfor %}") == {"nodes"}
    assert condition_variables("{{ node in kubernetes }}") == {"node", "kubernetes"}
    assert condition_variables("node in slurm") == {"node", "slurm"}


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_fuzz_variables_only_raises_template_problem(text: str) -> None:
    with contextlib.suppress(TemplateProblem):
        assert isinstance(variables(text), set)
    with contextlib.suppress(TemplateProblem):
        assert isinstance(condition_variables(text), set)
