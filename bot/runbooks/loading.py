"""Load and validate runbook files, with errors that name file, line and field.

Validation goes past the schema: every action must exist in the catalogue (with
a suggestion for a typo), every ``with:`` key must be an argument of its action,
and every template may only read the runbook's parameters and inventory facts.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from adapters.actions import StrictArguments
from bot.runbooks import catalogue as actions
from bot.runbooks import params, templating
from bot.runbooks.checked import Checked
from bot.runbooks.model import CHECK_KINDS, CheckSpec, Runbook
from bot.runbooks.partial import partial
from bot.runbooks.secrets import secret_names
from kit import yamldoc
from kit.canonical import canonical

Path_ = tuple[str | int, ...]
HOST_RUN = "host.run"


class RunbookError(Exception):
    """One or more problems with runbook files; each names the file and, where known, the line."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class LoadedRunbook:
    runbook: Runbook
    path: Path
    source: str
    content_hash: str  # sha256 of the canonical JSON of the parsed content

    @property
    def name(self) -> str:
        return self.runbook.name


class LaterArguments(Mapping[str, type[StrictArguments]]):
    """The arguments of the actions runbooks may name, made when first read: a file that
    passed its checks before (bot.runbooks.checked) needs none of them. ``mark`` stands for
    them in a check's key: "shipped" for every action the adapters ship (the code's)."""

    def __init__(self, make: Callable[[], Mapping[str, type[StrictArguments]]],
                 mark: str = "shipped") -> None:
        self._make = make
        self._made: Mapping[str, type[StrictArguments]] | None = None
        self.mark = mark

    def _all(self) -> Mapping[str, type[StrictArguments]]:
        if self._made is None:
            self._made = self._make()
        return self._made

    def __getitem__(self, name: str) -> type[StrictArguments]:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


def shipped_arguments() -> LaterArguments:
    """Every action any adapter ships, as ``runbook validate`` checks files against."""
    return LaterArguments(lambda: {name: known[0] for name, known in actions.known().items()})


def check_context(catalogue: Mapping[str, type[StrictArguments]],
                  host_commands: Collection[str] | None) -> str:
    """What a check took besides the file, for its key: the actions (their mark, else
    their names and argument models) and the host commands allowed."""
    mark = getattr(catalogue, "mark", None)
    named = mark if isinstance(mark, str) else sorted(
        (name, f"{model.__module__}.{model.__qualname__}") for name, model in catalogue.items())
    allowed = sorted(host_commands) if host_commands is not None else None
    return json.dumps([named, allowed])


def load_text(
    source: str, path: Path, catalogue: Mapping[str, type[StrictArguments]],
    host_commands: Collection[str] | None = None, checked: Checked | None = None,
) -> LoadedRunbook:
    """Parse and validate one runbook's text; raises RunbookError naming every problem.
    With ``host_commands`` (``runbook validate``), a host.run command or command check
    not among them is one too. ``checked``: the checks past the schema are skipped when
    this very text passed them before in the same context, and remembered when it passes."""
    data, lines = _parse_yaml(source, path)
    where = _Locator(path, lines)
    if not isinstance(data, dict):
        raise RunbookError([where.at((), "a runbook file must be a mapping")])
    plain = list(_plain_data_problems(data, (), where))
    if plain:
        raise RunbookError(plain)
    try:
        runbook = Runbook.model_validate(data)
    except ValidationError as exc:
        # the checks below still run on the parts that are valid on their own
        found, broken = partial(data)
        problems = [where.at(tuple(e["loc"]), _pydantic_message(e)) for e in exc.errors()]
        skipping = _Skipping(path, where.lines, tuple(broken))
        if not any(tuple(e["loc"]) == ("steps",) for e in exc.errors()):
            problems += _duplicate_step_ids(found, skipping)  # the model checks them last
        problems += _checks(found, catalogue, skipping, host_commands,
                            guard=not any(b[0] == "pre_checks" for b in broken))
        raise RunbookError([p for p in problems if p]) from exc
    key = checked.key(source, check_context(catalogue, host_commands)) if checked else ""
    if checked is None or key not in checked:
        problems = _checks(runbook, catalogue, where, host_commands)
        if problems:
            raise RunbookError(problems)
        if checked is not None:
            checked.add(key)
    digest = hashlib.sha256(canonical(data).encode()).hexdigest()
    return LoadedRunbook(runbook=runbook, path=path, source=source, content_hash=digest)


def _checks(runbook: Runbook, catalogue: Mapping[str, type[StrictArguments]],
            where: _Locator, host_commands: Collection[str] | None,
            guard: bool = True) -> list[str]:
    """The checks past the schema, every one of them (a problem in a part the locator
    skips is left out: it is empty)."""
    problems = (
        _check_defaults(runbook, where)
        + _check_actions(runbook, catalogue, where)
        + (_check_capacity_guard(runbook, where) if guard else [])
        + _check_templates(runbook, where)
        + _check_secret_uses(runbook, where)
    )
    if host_commands is not None:
        problems += host_command_problems(runbook, host_commands, where)
    return [p for p in problems if p]


def _duplicate_step_ids(runbook: Runbook, where: _Locator) -> list[str]:
    seen: dict[str, int] = {}
    problems = []
    for index, step in enumerate(runbook.steps):
        if step.id in seen:
            problems.append(where.at(("steps", index, "id"), f'step id "{step.id}" is used '
                                     f"twice (steps[{seen[step.id]}] and steps[{index}])"))
        seen.setdefault(step.id, index)
    return problems


def host_command_problems(runbook: Runbook, allowed: Collection[str],
                          where: _Locator) -> list[str]:
    """Each host.run command and command check that is not allow-listed (``host_commands``)."""
    problems = []
    for at, command in named_host_commands(runbook):
        if command not in allowed:
            hint = difflib.get_close_matches(command, sorted(allowed), n=1)
            suggestion = f' (did you mean "{hint[0]}"?)' if hint else ""
            listed = ", ".join(sorted(allowed)) or "none"
            problems.append(where.at(at, f'"{command}" is not an allow-listed host command '
                                         f"(host_commands: {listed}){suggestion}"))
    return problems


def named_host_commands(runbook: Runbook) -> list[tuple[Path_, str]]:
    """The host commands a runbook names (host.run steps and undos, command checks), where;
    a template is left out (its value is known only when the plan is made)."""
    named: list[tuple[Path_, Any]] = []
    for index, step in enumerate(runbook.steps):
        calls: list[tuple[Path_, str, dict[str, Any]]] = [
            (("steps", index), step.action, step.with_)]
        if step.undo is not None:
            calls.append((("steps", index, "undo"), step.undo.action, step.undo.with_))
        named += [((*at, "with", "command"), args.get("command"))
                  for at, action, args in calls if action == HOST_RUN]
    for section in ("pre_checks", "post_checks"):
        named += [((section, index, "command"), check.command)
                  for index, check in enumerate(getattr(runbook, section))]
    return [(at, command) for at, command in named if isinstance(command, str) and command
            and not templating.is_template(command)]


def load_file(path: Path, catalogue: Mapping[str, type[StrictArguments]],
              host_commands: Collection[str] | None = None,
              checked: Checked | None = None) -> LoadedRunbook:
    try:
        source = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise RunbookError([f"{path}: cannot read: {exc}"]) from exc
    return load_text(source, path, catalogue, host_commands, checked)


def runbook_files(paths: Iterable[Path]) -> list[Path]:
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files.extend(sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml")))
        else:
            files.append(path)
    return files


def load_all(
    paths: Iterable[Path], catalogue: Mapping[str, type[StrictArguments]],
    host_commands: Collection[str] | None = None, exempt: Path | None = None,
    checked: Checked | None = None,
) -> dict[str, LoadedRunbook]:
    """Every runbook under ``paths`` by name; all problems of all files in one RunbookError.
    ``host_commands``: checked in every file but those under ``exempt`` (the shipped
    runbooks, whose host commands a site configures when it uses them). ``checked``: the
    files that passed before (bot.runbooks.checked), saved again at the end."""
    try:
        return _load_all(paths, catalogue, host_commands, exempt, checked)
    finally:
        if checked is not None:
            checked.save()


def _load_all(
    paths: Iterable[Path], catalogue: Mapping[str, type[StrictArguments]],
    host_commands: Collection[str] | None, exempt: Path | None, checked: Checked | None,
) -> dict[str, LoadedRunbook]:
    found: dict[str, LoadedRunbook] = {}
    problems: list[str] = []
    for file in runbook_files(paths):
        mine = exempt is None or exempt.resolve() not in file.resolve().parents
        try:
            loaded = load_file(file, catalogue, host_commands if mine else None, checked)
        except RunbookError as exc:
            problems.extend(exc.problems)
            continue
        if loaded.name in found:
            problems.append(
                f'{file}: runbook "{loaded.name}" is also defined in {found[loaded.name].path}'
            )
            continue
        found[loaded.name] = loaded
    if problems:
        raise RunbookError(problems)
    return found


# --- YAML with line numbers (kit.yamldoc) ------------------------------------


def _parse_yaml(source: str, path: Path) -> tuple[Any, dict[Path_, int]]:
    """The document and the line of each value (kit.yamldoc); an empty file is refused."""
    try:
        data, lines = yamldoc.parse(source, path)
    except yamldoc.YamlProblem as exc:
        raise RunbookError(exc.problems) from exc
    if data is None and not lines:
        raise RunbookError([f"{path}: the file is empty"])
    return data, lines


_Locator = yamldoc.Locator
_dotted = yamldoc.dotted


@dataclass(frozen=True)
class _Skipping(yamldoc.Locator):
    """A locator that reports nothing ("") inside the parts it skips: the invalid parts of
    a file, whose problems the schema's validation has named already."""

    skip: tuple[Path_, ...] = ()

    def at(self, loc: Path_, message: str) -> str:
        if any(tuple(loc)[:len(part)] == part for part in self.skip):
            return ""
        return super().at(loc, message)


def _plain_data_problems(value: Any, at: Path_, where: _Locator) -> Iterable[str]:
    """Runbooks hold JSON's kinds of values only: no dates, sets, binary, NaN or non-text keys."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                yield where.at(at, f"the key {key!r} must be text (quote it)")
            else:
                yield from _plain_data_problems(item, (*at, key), where)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _plain_data_problems(item, (*at, index), where)
    elif isinstance(value, float) and not math.isfinite(value):
        yield where.at(at, f"{value} is not a number a runbook can use")
    elif value is not None and not isinstance(value, str | int | float):
        kind = type(value).__name__
        yield where.at(at, f"a {kind} value is not allowed here (quote it to make it text)")


def _pydantic_message(error: Any) -> str:
    if error["type"] == "extra_forbidden":
        return "unknown field"
    message = str(error["msg"])
    return message.removeprefix("Value error, ")


# --- actions and templates ---------------------------------------------------


def _check_defaults(runbook: Runbook, where: _Locator) -> list[str]:
    """A default must pass its own parameter's validation, or no run could ever start."""
    problems: list[str] = []
    for name, spec in runbook.params.items():
        if spec.default is not None and spec.type != "node":
            problem = params.default_problem(spec)
            if problem:
                problems.append(where.at(("params", name, "default"), problem))
    return problems


def _check_actions(
    runbook: Runbook, catalogue: Mapping[str, type[StrictArguments]], where: _Locator
) -> list[str]:
    problems: list[str] = []
    for index, step in enumerate(runbook.steps):
        calls: list[tuple[Path_, str, dict[str, Any]]] = [
            (("steps", index), step.action, step.with_)
        ]
        if step.undo is not None:
            calls.append((("steps", index, "undo"), step.undo.action, step.undo.with_))
        for at, action, args in calls:
            problems.extend(_check_call(at, action, args, catalogue, where))
    return problems


def _check_capacity_guard(runbook: Runbook, where: _Locator) -> list[str]:
    """A step whose action takes GPUs out of service (adapters.actions.takes_out) needs a
    ``capacity:`` pre-check: nobody can forget the floor in a new runbook. Which nodes the
    guard covers is checked again when the plan is made (bot.execution.planning)."""
    if any(check.capacity is not None for check in runbook.pre_checks):
        return []
    return [where.at(("steps", index, "action"),
                     f"{step.action} takes GPUs out of service: add a capacity pre-check "
                     f"over its nodes (pre_checks: - capacity: {{pool_of: ..., "
                     f"min_free_gpus_after: ...}})")
            for index, step in enumerate(runbook.steps)
            if step.action in actions.taking_out()]


def _check_call(
    at: Path_,
    action: str,
    args: dict[str, Any],
    catalogue: Mapping[str, type[StrictArguments]],
    where: _Locator,
) -> list[str]:
    model = catalogue.get(action)
    if model is None:
        hint = difflib.get_close_matches(action, sorted(catalogue), n=1)
        suggestion = f' (did you mean "{hint[0]}"?)' if hint else ""
        return [where.at((*at, "action"), f'unknown action "{action}"{suggestion}')]
    problems = []
    fields = model.model_fields
    for key in args:
        if key not in fields:
            hint = difflib.get_close_matches(key, sorted(fields), n=1)
            suggestion = f' (did you mean "{hint[0]}"?)' if hint else ""
            problems.append(
                where.at((*at, "with", key), f'{action} takes no argument "{key}"{suggestion}')
            )
    for key, info in fields.items():
        if info.is_required() and key not in args:
            problems.append(where.at((*at, "with"), f'{action} needs the argument "{key}"'))
    if not problems and not any(_has_template(v) for v in args.values()):
        try:
            model.model_validate(args)
        except ValidationError as exc:
            problems.extend(
                where.at((*at, "with", *e["loc"]), _pydantic_message(e)) for e in exc.errors()
            )
    return problems


def _has_template(value: Any) -> bool:
    if isinstance(value, str):
        return templating.is_template(value)
    if isinstance(value, list):
        return any(_has_template(v) for v in value)
    if isinstance(value, dict):
        return any(_has_template(v) for v in value.values())
    return False


def _strings(value: Any, at: Path_) -> Iterable[tuple[Path_, str]]:
    if isinstance(value, str):
        yield at, value
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _strings(item, (*at, index))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, (*at, key))


def _template_sites(runbook: Runbook) -> Iterable[tuple[Path_, str]]:
    yield from _strings(runbook.locks, ("locks",))
    if runbook.propose_on_failure is not None:
        yield from _strings(runbook.propose_on_failure.params, ("propose_on_failure", "params"))
    for index, step in enumerate(runbook.steps):
        yield from _strings(step.with_, ("steps", index, "with"))
        if step.undo is not None:
            yield from _strings(step.undo.with_, ("steps", index, "undo", "with"))
    for section in ("pre_checks", "post_checks"):
        checks: list[CheckSpec] = getattr(runbook, section)
        for index, check in enumerate(checks):
            for field in CHECK_KINDS:
                yield from _strings(getattr(check, field), (section, index, field))


def _check_secret_uses(runbook: Runbook, where: _Locator) -> list[str]:
    """A secret parameter goes only into a step's arguments (its own and its undo's), and
    whole (``{{ token }}``): the plan holds a placeholder that the engine replaces as the
    action is called, so a filter, a condition, a lock or a check could not see the value."""
    names = set(secret_names(runbook))
    if not names:
        return []
    problems: list[str] = []
    for at, text in _template_sites(runbook):
        in_step = at[0] == "steps"
        for name in sorted(names & _used(text, names, in_step)):
            problems.append(where.at(at, (
                f'the secret parameter "{name}" may be used only whole ({{{{ {name} }}}}) '
                "in a step's with:" if in_step else
                f'the secret parameter "{name}" may be used only in a step\'s with:')))
    for at, condition in _conditions(runbook):
        try:
            used = templating.condition_variables(condition)
        except templating.TemplateProblem:
            continue  # _check_templates reports it
        for name in sorted(names & used):
            problems.append(where.at(at, f'the secret parameter "{name}" may be used only '
                                         "in a step's with:"))
    return problems


def _used(text: str, names: set[str], whole_allowed: bool) -> set[str]:
    """Secret names ``text`` reads, leaving out whole uses where they are allowed."""
    if whole_allowed:
        for name in names:
            text = re.sub(r"\{\{\s*" + re.escape(name) + r"\s*\}\}", "", text)
    try:
        return templating.variables(text)
    except templating.TemplateProblem:
        return set()  # _check_templates reports it


def _conditions(runbook: Runbook) -> list[tuple[Path_, str]]:
    conditions: list[tuple[Path_, str]] = [
        (("steps", index, "when"), step.when)
        for index, step in enumerate(runbook.steps) if step.when is not None
    ]
    for section in ("pre_checks", "post_checks"):
        conditions += [((section, index, "when"), c.when)
                       for index, c in enumerate(getattr(runbook, section)) if c.when is not None]
    return conditions


def _check_templates(runbook: Runbook, where: _Locator) -> list[str]:
    allowed = set(runbook.params) | set(templating.FACTS)
    problems: list[str] = []

    def check(at: Path_, names: set[str]) -> None:
        unknown = sorted(names - allowed)
        for name in unknown:
            hint = difflib.get_close_matches(name, sorted(allowed), n=1)
            suggestion = f' (did you mean "{hint[0]}"?)' if hint else ""
            problems.append(
                where.at(at, f'template uses "{name}", which is not a parameter{suggestion}')
            )

    for at, text in _template_sites(runbook):
        try:
            check(at, templating.variables(text))
        except templating.TemplateProblem as exc:
            problems.append(where.at(at, str(exc)))
    for at, condition in _conditions(runbook):
        try:
            check(at, templating.condition_variables(condition))
        except templating.TemplateProblem as exc:
            problems.append(where.at(at, str(exc)))
    return problems
