"""Request parameters: validation against a runbook (the chat grammar, bot.surfaces.chat.words,
reads the ``key=value`` words).

Everything a person types is checked here, before any plan is made. Values
never reach a shell, yet characters that only make sense to a shell are still
refused in node names and free text, so a pasted command is not mistaken for a
reason.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bot.config.drivers import below_floor
from kit import hostlist
from kit.durations import format_duration, parse_duration

if TYPE_CHECKING:  # annotations only: the inventory (runbook node) needs no runbook model
    from bot.runbooks.model import ParamSpec, Runbook

NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
VERSION = re.compile(r"^\d+(?:\.\d+){0,3}(?:[-+][0-9A-Za-z.-]{1,40})?$")
SHELLISH = re.compile(r"[`$;|&<>\\]")
# C0/C1 controls (tab and newline aside), line separators and bidi overrides that can disguise text
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
TRUE = {"true", "yes", "on", "1"}
FALSE = {"false", "no", "off", "0"}


class ParamError(ValueError):
    """One or more parameters are wrong; ``problems`` lists each for the person."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class Duration(float):
    """Seconds that print the way people wrote them (``2h``)."""

    def __str__(self) -> str:
        return format_duration(self)


class _Names(dict[str, str]):
    """A node's name in another system; the bot's own name when no mapping says otherwise."""

    def __missing__(self, key: str) -> str:
        return key


@dataclass(frozen=True)
class Inventory:
    """The nodes the bot may act on, which pool each belongs to, and their other names."""

    nodes: frozenset[str] = frozenset()
    slurm: frozenset[str] = frozenset()
    kubernetes: frozenset[str] = frozenset()
    names: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # the configuration's MIG layouts (mig.layouts): name -> MIG devices per GPU
    mig_layouts: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    # the lowest driver each pool's CUDA versions allow (drivers): pool -> (driver, CUDA)
    driver_floors: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    def facts(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes, "slurm": self.slurm, "kubernetes": self.kubernetes,
            "mig_layouts": {name: dict(devices) for name, devices in self.mig_layouts.items()},
            **{f"{system}_name": _Names(self.names.get(system, {}))
               for system in ("slurm", "kubernetes", "dcgm")},
        }


def validate(runbook: Runbook, raw: Mapping[str, Any], inventory: Inventory) -> dict[str, Any]:
    """Typed parameter values for ``runbook``, defaults filled in; or ParamError."""
    problems: list[str] = []
    for key in raw:
        if key not in runbook.params:
            problems.append(_unknown(runbook, key))
    values: dict[str, Any] = {}
    for name, spec in runbook.params.items():
        if name not in raw:
            if spec.required:
                problems.append(f"{name} is required ({_describe(spec)})")
            elif spec.default is not None:
                values[name] = _convert(name, spec, spec.default, inventory, problems)
            else:
                values[name] = None
            continue
        values[name] = _convert(name, spec, raw[name], inventory, problems)
    if not problems:
        problems.extend(_driver_floors(runbook, values, inventory))
    if problems:
        raise ParamError(problems)
    return values


def _driver_floors(runbook: Runbook, values: Mapping[str, Any],
                   inventory: Inventory) -> list[str]:
    """A driver version below what its pool's CUDA versions need (``driver_for_pool``)."""
    problems = []
    for name, spec in runbook.params.items():
        pool = values.get(spec.driver_for_pool) if spec.driver_for_pool else None
        if pool is None or values.get(name) is None:
            continue
        why = below_floor(str(values[name]), inventory.driver_floors.get(str(pool)))
        if why:
            problems.append(f"{name}: {why.replace('POOL', str(pool))}")
    return problems


def default_problem(spec: ParamSpec) -> str | None:
    """Why ``spec.default`` would be refused (a node default is checked per run, a MIG layout
    against the configuration per request), or None."""
    if spec.type == "mig_layout":
        return None
    problems: list[str] = []
    _convert("default", spec, spec.default, Inventory(), problems)
    return problems[0].removeprefix("default: ") if problems else None


@dataclass(frozen=True)
class WeakenedGuard:
    """A request value that weakens a guard its runbook marks (``weakens_guard``): the
    request is break-glass. ``default`` and ``value`` are as the plan shows them."""

    param: str
    weakens: str  # lower | higher | changed (the runbook's marking)
    default: Any
    value: Any
    guard: str = ""  # the parameter's description: what it guards

    def describe(self) -> str:
        how = {"lower": "lower than", "higher": "higher than"}.get(self.weakens, "not")
        what = f" ({self.guard})" if self.guard else ""
        return (f"{self.param}={_shown(self.value)} weakens a guard{what}: it is {how} its "
                f"default {_shown(self.default)}")


def weakened_guards(runbook: Runbook, values: Mapping[str, Any],
                    inventory: Inventory) -> list[WeakenedGuard]:
    """The parameters of ``values`` (as ``validate`` returns them) that weaken a guard: below
    their default when marked ``lower``, above it when ``higher``, other than it when
    ``changed``."""
    found: list[WeakenedGuard] = []
    for name, spec in runbook.params.items():
        if spec.weakens_guard is None or spec.default is None:
            continue
        problems: list[str] = []
        default = _convert(name, spec, spec.default, inventory, problems)
        value = values.get(name)
        if problems or value is None:  # validate refused it already; never pass silently
            raise ParamError(problems or [f"{name} has no value"])
        if spec.weakens_guard == "lower":
            weaker = value < default
        elif spec.weakens_guard == "higher":
            weaker = value > default
        else:
            weaker = value != default
        if weaker:
            shown = jsonable({"default": default, "value": value})
            found.append(WeakenedGuard(name, spec.weakens_guard, shown["default"],
                                       shown["value"], spec.description))
    return found


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def jsonable(values: Mapping[str, Any]) -> dict[str, Any]:
    """Parameter values as JSON can hold them (durations as their written form)."""
    return {k: str(v) if isinstance(v, Duration) else v for k, v in values.items()}


def _unknown(runbook: Runbook, key: str) -> str:
    known = sorted(runbook.params)
    hint = difflib.get_close_matches(key, known, n=1)
    suggestion = f' (did you mean "{hint[0]}"?)' if hint else ""
    takes = ", ".join(known) or "no parameters"
    return f'unknown parameter "{_short(key)}"{suggestion}; {runbook.name} takes: {takes}'


def _describe(spec: ParamSpec) -> str:
    if spec.description:
        return spec.description
    return {"node": "a node name like gpu07", "nodes": "a hostlist like gpu[01-04,07]",
            "duration": "like 30m or 2h",
            "mig_layout": "a MIG layout the configuration lists (mig.layouts)"}.get(
        spec.type, f"a {spec.type}"
    )


def _convert(
    name: str, spec: ParamSpec, value: Any, inventory: Inventory, problems: list[str]
) -> Any:
    try:
        return _CONVERTERS[spec.type](spec, value, inventory)
    except ValueError as exc:
        problems.append(f"{name}: {exc}")
        return None


def _text(spec: ParamSpec, value: Any, _: Inventory) -> str:
    text = str(value)
    limit = spec.max_length or 200
    if len(text) > limit:
        raise ValueError(f"{len(text)} characters; at most {limit}")
    if CONTROL.search(text):
        raise ValueError("control characters are not allowed")
    if SHELLISH.search(text):
        raise ValueError(
            "the characters ` $ ; | & < > \\ are not allowed (values never reach a shell, "
            "and a pasted command must not pass for a reason)"
        )
    if spec.secret and not text:
        raise ValueError("a secret cannot be empty")
    if spec.pattern and not re.fullmatch(spec.pattern, text):
        shown = "the secret" if spec.secret else f'"{_short(text)}"'  # never echo a secret
        raise ValueError(f"{shown} does not match {spec.pattern}")
    return text


def _node(spec: ParamSpec, value: Any, inventory: Inventory) -> str:
    text = str(value)
    if not NODE.fullmatch(text):
        raise ValueError(
            f'"{_short(text)}" is not a node name (letters, digits, . _ -; at most 63)'
        )
    if text not in inventory.nodes:
        if not inventory.nodes:
            raise ValueError(f'"{text}" is not in the inventory (the inventory is empty)')
        hint = difflib.get_close_matches(text, sorted(inventory.nodes), n=3)
        suggestion = f" (did you mean {', '.join(hint)}?)" if hint else ""
        raise ValueError(f'"{text}" is not a known node{suggestion}')
    return text


def _nodes(spec: ParamSpec, value: Any, inventory: Inventory) -> str:
    """A hostlist (``gpu[01-04,07]``) of known nodes; kept in its compressed form. One that
    names more nodes than the inventory holds is refused from its ranges, before a name is
    made (``gpu[0-99999999]`` costs nothing)."""
    text = str(value)
    try:
        names = hostlist.expand(text, limit=len(inventory.nodes))
    except hostlist.TooMany as exc:
        held = len(inventory.nodes)
        if not held:
            raise ValueError(f'"{_short(text)}": not known (the inventory is empty)') from None
        bound = (f"the inventory holds {held:,}" if exc.limit == held
                 else f"at most {exc.limit:,} at once")
        raise ValueError(f"{_short(text)} names {exc.count:,} nodes; {bound}") from None
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    unknown = [name for name in names if name not in inventory.nodes]
    if unknown:
        shown = hostlist.compress(unknown) if all(NODE.fullmatch(n) for n in unknown) else "?"
        raise ValueError(f"{shown}: not known node(s) ({len(unknown)} of {len(names)})")
    limit = int(spec.max) if spec.max is not None else None
    if limit is not None and len(names) > limit:
        raise ValueError(f"{len(names)} nodes; at most {limit}")
    return hostlist.compress(names)


def _int(spec: ParamSpec, value: Any, _: Inventory) -> int:
    if isinstance(value, bool):
        raise ValueError("expected a whole number")
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ValueError(f'"{_short(str(value))}" is not a whole number') from None
    _limits(spec, number, str(number))
    return number


def _bool(spec: ParamSpec, value: Any, _: Inventory) -> bool:
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in TRUE:
        return True
    if word in FALSE:
        return False
    raise ValueError(f'"{_short(str(value))}" is not true or false')


def _duration(spec: ParamSpec, value: Any, _: Inventory) -> Duration:
    seconds = Duration(parse_duration(value))
    _limits(spec, seconds, str(seconds))
    return seconds


def _enum(spec: ParamSpec, value: Any, _: Inventory) -> str:
    text = str(value)
    choices = spec.choices or []
    if text not in choices:
        raise ValueError(f'"{_short(text)}" is not one of {", ".join(choices)}')
    return text


def _version(spec: ParamSpec, value: Any, _: Inventory) -> str:
    text = str(value)
    if not VERSION.fullmatch(text):
        raise ValueError(f'"{_short(text)}" is not a version like 550.54.15')
    return text


def _mig_layout(spec: ParamSpec, value: Any, inventory: Inventory) -> str:
    """A MIG layout the configuration lists (``mig.layouts``), nothing else."""
    text = str(value)
    known = sorted(inventory.mig_layouts)
    if text not in inventory.mig_layouts:
        if not known:
            raise ValueError(f'"{_short(text)}" is not a configured MIG layout (the '
                             "configuration lists none: mig.layouts)")
        hint = difflib.get_close_matches(text, known, n=1)
        suggestion = f' (did you mean "{hint[0]}"?)' if hint else ""
        raise ValueError(f'"{_short(text)}" is not a configured MIG layout{suggestion}; '
                         f"allowed: {', '.join(known)}")
    return text


def _limits(spec: ParamSpec, number: float, shown: str) -> None:
    if spec.min is not None and number < spec.min:
        raise ValueError(f"{shown} is below the minimum {_num(spec.min, spec)}")
    if spec.max is not None and number > spec.max:
        raise ValueError(f"{shown} is above the maximum {_num(spec.max, spec)}")


def _num(limit: float, spec: ParamSpec) -> str:
    return format_duration(limit) if spec.type == "duration" else f"{limit:g}"


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


_CONVERTERS = {
    "text": _text,
    "node": _node,
    "nodes": _nodes,
    "int": _int,
    "bool": _bool,
    "duration": _duration,
    "enum": _enum,
    "version": _version,
    "mig_layout": _mig_layout,
}


def params_text(params: dict[str, Any]) -> str:
    """``node=gpu07 reason="XID 79"``; a parameter not given (no default) is left out."""
    return " ".join(f"{k}={value_text(v)}" for k, v in params.items() if v is not None) or "none"


def value_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    return json.dumps(text) if (" " in text or not text) else text
