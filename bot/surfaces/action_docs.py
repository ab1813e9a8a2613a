"""docs/actions.md, made from the action classes: every action a runbook step may name, the
configuration section that enables it, what it does (its docstring), its ``with:`` arguments
(type, required or default, description), whether it takes GPUs out, whether a crash in it
is re-run, what it needs of the Slurm backend, and the undo the shipped runbooks give it.
``runbook docs actions`` prints it; a test fails when the committed page differs.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

HEADER = """# Actions

<!-- Made by `runbook docs actions > docs/actions.md`: edit the action classes, not this page
(a test fails when it is out of date). -->

Every action a runbook step may name (`action:`), with its `with:` arguments. An action is
there when its configuration section is (`always`: whatever is configured); a runbook naming
one that is not configured still loads, and planning it says which section is missing.
Any argument may be a template (`"{{ node }}"`), rendered when the plan is made; a duration
argument (seconds) may also be written as a duration (`90s`, `30m`, `2h`). How steps, undo
and checks fit together: [writing-runbooks.md](writing-runbooks.md). The JSON Schema that
editors check runbooks with is `docs/schema/runbook.schema.json` (`runbook schema runbook`).
"""


def page(classes: dict[str, tuple[type[Any], str]], runbooks: Iterable[Path]) -> str:
    undos = _undos(runbooks)
    parts = [HEADER, "| action | section | takes GPUs out |", "|---|---|---|"]
    parts += [f"| [`{name}`](#{_anchor(name)}) | {section} | "
              f"{'yes' if getattr(cls, 'takes_out', ()) else ''} |"
              for name, (cls, section) in sorted(classes.items())]
    for name, (cls, section) in sorted(classes.items()):
        parts += ["", *_action(name, cls, section, undos.get(name, {}))]
    return "\n".join(parts) + "\n"


def _anchor(name: str) -> str:
    return name.replace(".", "").lower()  # how a page's heading ## slurm.drain is linked


def _action(name: str, cls: type[Any], section: str, undone: dict[str, list[str]]) -> list[str]:
    lines = [f"## {name}", ""]
    doc = inspect.cleandoc(cls.__doc__ or "").strip()
    if doc.startswith(f"``{name}``:"):
        doc = doc.split(":", 1)[1].strip()
    if doc:
        lines += [" ".join(doc.split()), ""]
    facts = [f"section: `{section}`"]
    taken = getattr(cls, "takes_out", ())
    if taken:
        facts.append("takes GPUs out of service: " + ", ".join(
            "a whole pool" if t == "*" else f"`{t}`" for t in taken)
            + " (the runbook needs a capacity pre-check)")
    if not getattr(cls, "idempotent", True):
        facts.append("not re-run after a crash in it: held for a person")
    needs = getattr(cls, "needs", None)
    if needs:
        facts.append("needs of the Slurm backend: " + ", ".join(f"`{n}`" for n in needs))
    if undone:
        facts.append("undo in the shipped runbooks: " + "; ".join(
            f"`{undo}` ({', '.join(sorted(books))})" for undo, books in sorted(undone.items())))
    lines += [f"- {fact}" for fact in facts]
    lines += ["", *_arguments(cls.Arguments)]
    return lines


def _arguments(model: Any) -> list[str]:
    schema = model.model_json_schema(mode="validation")
    properties = schema.get("properties", {})
    if not properties:
        return ["No arguments."]
    lines = ["| argument | type | required / default | description |", "|---|---|---|---|"]
    for name, info in model.model_fields.items():
        prop = properties.get(name, {})
        need = "required" if info.is_required() else f"default `{_default(info)}`"
        text = " ".join((info.description or prop.get("description") or "").split())
        text = text.replace("|", "\\|")
        lines.append(f"| `{name}` | {_type(prop)} | {need} | {text} |")
    return lines


def _default(info: Any) -> str:
    value = info.get_default(call_default_factory=True)
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value) if not isinstance(value, str) else (
        value or '""')


def _type(prop: dict[str, Any]) -> str:
    if "enum" in prop:
        return " \\| ".join(f"`{v}`" for v in prop["enum"])
    if "const" in prop:
        return f"`{prop['const']}`"
    if "anyOf" in prop:
        kinds = [_type(p) for p in prop["anyOf"] if p.get("type") != "null"]
        return " or ".join(kinds) + (" or null" if len(kinds) < len(prop["anyOf"]) else "")
    if "$ref" in prop:
        return "object"
    kind = prop.get("type", "any")
    if kind == "array":
        return f"list of {_type(prop.get('items', {}))}"
    if kind == "object" and "additionalProperties" in prop and isinstance(
            prop["additionalProperties"], dict):
        return f"map of {_type(prop['additionalProperties'])}"
    return {"string": "text", "integer": "int", "number": "number", "boolean": "bool"}.get(
        kind, str(kind))


def _undos(runbooks: Iterable[Path]) -> dict[str, dict[str, list[str]]]:
    """Action -> its undo action -> the shipped runbooks that undo it so."""
    found: dict[str, dict[str, list[str]]] = {}
    for path in runbooks:
        book = yaml.safe_load(path.read_text())
        for step in book.get("steps") or []:
            undo = step.get("undo")
            if undo:
                found.setdefault(step["action"], {}).setdefault(undo["action"], []).append(
                    book["name"])
    return {action: {undo: sorted(set(books)) for undo, books in undos.items()}
            for action, undos in found.items()}
