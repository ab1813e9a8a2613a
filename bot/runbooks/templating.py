"""Templates in runbooks render in Jinja2's sandbox, from validated values only.

``StrictUndefined`` turns a typo into an error instead of an empty string, and
``variables()`` lets the loader refuse a template that names anything but the
runbook's parameters and the inventory facts. A template that is exactly one
expression (``"{{ timeout }}"``) yields the value itself, not its text, so an
integer stays an integer on its way to an action. ``render_query`` renders PromQL templates
under the one rule of adapters/prometheus/template.py.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

from adapters.prometheus.template import QueryShapeError, place, seal
from kit import hostlist

# Inventory facts a template may use: the pools (sets of the bot's node names) and each
# node's name in another system (kubernetes_name[node]).
FACTS = ("nodes", "slurm", "kubernetes", "slurm_name", "kubernetes_name", "dcgm_name",
         "previous_driver_version",  # the version before the last gpu_operator change
         "mig_layouts",  # the configuration's MIG layouts: name -> devices per GPU
         "drivers",  # per pool: drivers.slurm.pinned, .floor, .cuda (configuration drivers:)
         "pools")  # the pool hand-off's marks: pools.label, .taint, .reason, .feature
_SINGLE = re.compile(r"^\{\{\s*(.+?)\s*\}\}$", re.DOTALL)


class TemplateProblem(Exception):
    """A template cannot be parsed or rendered."""


def in_pool(nodes: str, pool: Collection[str], names: Mapping[str, str]) -> str:
    """``{{ nodes | in_pool(slurm, slurm_name) }}``: the nodes of a hostlist that are in
    ``pool``, by their names there, as a hostlist ("" when none): a set's steps per system."""
    found = [names[node] for node in hostlist.expand(str(nodes)) if node in pool]
    return hostlist.compress(found) if found else ""



def name_map(nodes: str | Collection[str], pool: Collection[str], names: Mapping[str, str],
             values: Mapping[str, str], without: str = "") -> dict[str, str]:
    """``{{ nodes | name_map(kubernetes, kubernetes_name, dcgm_name) }}``: for the nodes of a
    hostlist (or a set: ``kubernetes``) in ``pool`` and not in the hostlist ``without``,
    their name there -> another of their names (a set's DCGM names)."""
    left_out = set(hostlist.expand(str(without))) if without else set()
    given = hostlist.expand(nodes) if isinstance(nodes, str) else sorted(nodes)
    return {names[node]: values.get(node, "") for node in given
            if node in pool and node not in left_out}



@dataclass(frozen=True)
class _Jinja:
    env: Any  # runbook templates and conditions
    query_env: Any  # PromQL templates: every {{ }} through place, the result through seal
    error: type[Exception]  # jinja2.TemplateError
    undefined: type[Any]  # jinja2.Undefined
    meta: Any  # jinja2.meta


@cache
def _jinja() -> _Jinja:
    """Jinja2's sandbox, imported at first use: a command that renders no template (status,
    history...) never loads it."""
    from jinja2 import StrictUndefined, TemplateError, Undefined, meta
    from jinja2.sandbox import SandboxedEnvironment

    env = SandboxedEnvironment(undefined=StrictUndefined, autoescape=False,
                               keep_trailing_newline=True)
    query_env = SandboxedEnvironment(undefined=StrictUndefined, autoescape=False,
                                     keep_trailing_newline=True, finalize=place)
    for made in (env, query_env):
        made.filters.update(in_pool=in_pool, name_map=name_map)
    return _Jinja(env, query_env, TemplateError, Undefined, meta)


def is_template(text: str) -> bool:
    return "{{" in text or "{%" in text


def variables(text: str) -> set[str]:
    """Names a template reads from its context."""
    try:
        return set(_jinja().meta.find_undeclared_variables(_jinja().env.parse(text)))
    except _jinja().error as exc:
        raise TemplateProblem(f"template {text!r}: {exc}") from exc


@lru_cache(maxsize=4096)
def _expression(source: str) -> Any:
    return _jinja().env.compile_expression(source, undefined_to_none=False)


@lru_cache(maxsize=4096)
def _template(source: str) -> Any:
    return _jinja().env.from_string(source)


@lru_cache(maxsize=1024)
def _query_template(source: str) -> Any:
    return _jinja().query_env.from_string(source)


def render_query(text: str, context: Mapping[str, Any]) -> str:
    """A PromQL template (a ``promql:`` check, a step's query argument) rendered so that
    every value is a label value or a number: the query's structure is the template's."""
    try:
        return seal(_query_template(text).render(**context))
    except (_jinja().error, QueryShapeError) as exc:
        raise TemplateProblem(f"query {text!r}: {exc}") from exc


def render(value: Any, context: Mapping[str, Any]) -> Any:
    """Render every template string inside ``value`` (str, list or mapping)."""
    if isinstance(value, str):
        return _render_text(value, context)
    if isinstance(value, list):
        return [render(item, context) for item in value]
    if isinstance(value, dict):
        return {key: render(item, context) for key, item in value.items()}
    return value


def _render_text(text: str, context: Mapping[str, Any]) -> Any:
    if not is_template(text):
        return text
    try:
        single = _SINGLE.match(text)
        if single and "{{" not in single.group(1) and "}}" not in single.group(1):
            return _plain(_defined(_expression(single.group(1))(**context)))
        return _template(text).render(**context)
    except _jinja().error as exc:
        raise TemplateProblem(f"template {text!r}: {exc}") from exc


def _plain(result: Any) -> Any:
    """Sets (the inventory facts) become sorted lists, so a plan stays JSON."""
    if isinstance(result, set | frozenset):
        return sorted(result, key=str)
    return result


def _defined(result: Any) -> Any:
    """An expression's value; an undefined one (a typo, an unsafe attribute) raises its error."""
    if isinstance(result, _jinja().undefined):
        str(result)  # StrictUndefined raises UndefinedError or SecurityError here
        raise TemplateProblem(f"undefined value: {result!r}")  # pragma: no cover
    return result


def _condition_source(text: str) -> str:
    """The one expression of a ``when:`` (``"{{ x }}"`` or bare ``x``)."""
    single = _SINGLE.match(text.strip())
    source = single.group(1) if single else text
    if "{{" in source or "}}" in source or "{%" in source:
        raise TemplateProblem(f"condition {text!r}: must be one expression, like {{{{ x == 1 }}}}")
    return source


def condition(text: str, context: Mapping[str, Any]) -> bool:
    """Evaluate a ``when:`` condition; it must come out true or false."""
    source = _condition_source(text)
    try:
        result = _defined(_expression(source)(**context))
    except _jinja().error as exc:
        raise TemplateProblem(f"condition {text!r}: {exc}") from exc
    if not isinstance(result, bool):
        raise TemplateProblem(f"condition {text!r} gave {result!r}, not true or false")
    return result


def condition_variables(text: str) -> set[str]:
    source = _condition_source(text)
    try:
        _expression(source)
    except _jinja().error as exc:
        raise TemplateProblem(f"condition {text!r}: {exc}") from exc
    return variables("{{ " + source + " }}")
