"""A runbook made of the parts of a file that are valid on their own, so that one invalid
part (a step id used twice, an unknown field in one step) does not hide the problems of the
others: bot.runbooks.loading runs its checks of actions, templates and guards on it.

Never used to run anything: it is unvalidated as a whole (``model_construct``), and a part
that does not validate stands in as a harmless placeholder whose problems are not reported.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from bot.runbooks.model import CheckSpec, ParamSpec, ProposeSpec, Runbook, StepSpec

Path_ = tuple[str | int, ...]

_ITEMS: dict[str, type[BaseModel]] = {"steps": StepSpec, "pre_checks": CheckSpec,
                                      "post_checks": CheckSpec}


def partial(data: dict[str, Any]) -> tuple[Runbook, list[Path_]]:
    """The runbook of the valid parts of ``data``, and where the invalid ones are."""
    broken: list[Path_] = []
    fields: dict[str, Any] = {}
    for name, info in Runbook.model_fields.items():
        key = info.alias or name
        if key not in data:
            continue
        value = data[key]
        if name in _ITEMS:
            fields[name] = _items(name, value, broken)
        elif name == "params":
            fields[name] = _params(value, broken)
        else:
            model = ProposeSpec if name == "propose_on_failure" else None
            try:
                fields[name] = (model.model_validate(value) if model and value is not None
                                else TypeAdapter(info.annotation or Any).validate_python(value))
            except ValidationError:
                broken.append((key,))
    required = {"name": "", "version": "", "summary": "", "risk": "low", "steps": []}
    return Runbook.model_construct(**{**required, **fields}), broken


def _items(name: str, value: Any, broken: list[Path_]) -> list[Any]:
    model = _ITEMS[name]
    found: list[Any] = []
    for index, item in enumerate(value if isinstance(value, list) else []):
        try:
            found.append(model.model_validate(item))
        except ValidationError:
            broken.append((name, index))
            found.append(_placeholder(model, index))
    return found


def _placeholder(model: type[BaseModel], index: int) -> Any:
    if model is StepSpec:
        return StepSpec.model_construct(id=f"invalid-{index}", action="chat.notify",
                                        with_={"message": ""})
    return CheckSpec.model_construct(name=f"invalid {index}")


def _params(value: Any, broken: list[Path_]) -> dict[str, ParamSpec]:
    """Every parameter keeps its name (templates may use it), valid or not."""
    found: dict[str, ParamSpec] = {}
    for key, spec in (value.items() if isinstance(value, dict) else []):
        try:
            found[str(key)] = ParamSpec.model_validate(spec)
        except ValidationError:
            broken.append(("params", str(key)))
            found[str(key)] = ParamSpec.model_construct(type="text")
    return found

