"""The configuration's problems as runbook problems read: one line each,
``FILE:LINE: path: what is wrong (did you mean ...?)``, every problem of the file at once.

It only words pydantic's errors, placing each on its line (kit.yamldoc) and naming, for an
unknown key, the nearest key the section takes; it validates nothing itself.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from kit.yamldoc import Loc, Locator


def problems(exc: ValidationError, model: type[BaseModel], where: Locator) -> list[str]:
    """One line per error of ``exc`` (raised validating ``model``), in the file's order."""
    found: list[tuple[int, str]] = []
    for error in exc.errors():
        loc: Loc = tuple(error["loc"])
        if error["type"] == "extra_forbidden":
            message = "unknown field" + _suggestion(model, loc)
        else:
            message = str(error["msg"]).removeprefix("Value error, ")
        found.append((_line(where, loc), where.at(loc, message)))
    return [text for _, text in sorted(found, key=lambda item: item[0])]


def _line(where: Locator, loc: Loc) -> int:
    probe = loc
    while probe and probe not in where.lines:
        probe = probe[:-1]
    return where.lines.get(probe, 0)


def _suggestion(model: type[BaseModel], loc: Loc) -> str:
    section = _model_at(model, loc[:-1])
    if section is None or not loc:
        return ""
    names = sorted(section.model_fields)
    hint = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.6)
    return f' (did you mean "{hint[0]}"?)' if hint else ""


def _model_at(model: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    """The model class that validates the mapping at ``loc``, following fields, dict values
    and list items; None where no single model does (a union, a plain value)."""
    current: Any = model
    parts = list(loc)
    while parts:
        part = parts.pop(0)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return None
            current = _unwrap(field.annotation)
            continue
        origin = typing.get_origin(current)
        if origin is dict:
            current = _unwrap(typing.get_args(current)[1])
        elif origin is list:
            current = _unwrap(typing.get_args(current)[0])
        else:
            return None
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    """``X | None`` and ``Annotated[X, ...]`` as X."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(members) != 1:
                return annotation
            annotation = members[0]
        else:
            return annotation
