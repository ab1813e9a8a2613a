"""JSON Schema of the runbook format and of the configuration, for editors and tools.

Made from the pydantic models (bot.runbooks.model, bot.config), with each action's ``with:``
arguments as a schema of its own, chosen by the step's ``action``. A schema helps while a
file is typed; ``runbook validate`` remains the judge (templates, parameters, guards).
``runbook schema runbook|config`` prints them; docs/schema/ holds the committed copies.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from adapters.actions import StrictArguments
from kit.durations import parse_duration

DIALECT = "https://json-schema.org/draft/2020-12/schema"
# a value rendered from a template when the plan is made: any text with {{ ... }} in it
TEMPLATE = {"type": "string", "pattern": r"\{\{.*\}\}"}
DURATION = {"type": "string", "description": "a duration: 90s, 30m, 2h, 1h30m, 1d"}


def runbook_schema() -> dict[str, Any]:
    from bot.runbooks.catalogue import KNOWN
    from bot.runbooks.model import Runbook

    schema = _top(Runbook, "runbook", "A runbook file of GPU Runbook Bot")
    defs = schema["$defs"]
    for spec in ("min", "max"):  # limits of duration parameters may be durations (48h)
        defs["ParamSpec"]["properties"][spec]["anyOf"].insert(1, DURATION)
    names = sorted(KNOWN)
    branches = []
    for name in names:
        key = f"with:{name}"
        defs[key] = _arguments(KNOWN[name][0], defs)
        branches.append({"if": {"properties": {"action": {"const": name}},
                                "required": ["action"]},
                         "then": {"properties": {"with": {"$ref": f"#/$defs/{key}"}}}})
    defs["with:by-action"] = {"allOf": branches}
    for call in ("StepSpec", "UndoSpec"):
        defs[call]["properties"]["action"] = {"enum": names, "description": "the action "
                                              "(docs/actions.md)"}
        defs[call]["allOf"] = [{"$ref": "#/$defs/with:by-action"}]
    return schema


def config_schema() -> dict[str, Any]:
    from bot.config import Config

    return _top(Config, "config", "The configuration file of GPU Runbook Bot")


def _top(model: type[BaseModel], kind: str, title: str) -> dict[str, Any]:
    schema = model.model_json_schema(by_alias=True, mode="validation")
    return {"$schema": DIALECT, "$id": f"{kind}.schema.json", **schema, "title": title}


def _arguments(model: type[StrictArguments], defs: dict[str, Any]) -> dict[str, Any]:
    """An action's arguments: its own schema, where each argument may also be a template,
    and a duration argument (seconds) also a duration as text. Models nested in it go to
    ``defs`` under the name of their module, so that two of one name never clash."""
    prefix = f"{model.__module__}."
    schema = model.model_json_schema(mode="validation",
                                     ref_template=f"#/$defs/{prefix}{{model}}")
    defs.update({prefix + name: body for name, body in schema.pop("$defs", {}).items()})
    properties = schema.get("properties", {})
    for name, info in model.model_fields.items():
        alternatives = [properties[name], TEMPLATE]
        if _takes_duration(info.metadata):
            alternatives.append(DURATION)
        properties[name] = {"anyOf": alternatives}
    return schema


def _takes_duration(metadata: list[Any]) -> bool:
    return any(getattr(item, "func", None) is parse_duration for item in metadata)


def dumps(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"
