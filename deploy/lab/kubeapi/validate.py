"""The validation the real server does on the fields this lab's clients write (422s)."""
from __future__ import annotations

import re

from . import errors
from .errors import Obj
from .resources import Resource

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_VALUE = re.compile(rf"^({_NAME})?$")
LABEL_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                       rf"{_NAME}$")
TAINT_EFFECTS = ["NoExecute", "NoSchedule", "PreferNoSchedule"]
VALUE_MSG = ("a valid label must be an empty string or consist of alphanumeric characters, "
             "'-', '_' or '.', and must start and end with an alphanumeric character")
KEY_MSG = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start "
           "and end with an alphanumeric character")


def validate(res: Resource, obj: Obj) -> None:
    causes: list[tuple[str, str, str]] = []
    meta = obj.get("metadata", {})
    for key, value in (meta.get("labels") or {}).items():
        if not isinstance(key, str) or not LABEL_KEY.match(key) or len(key) > 317:
            causes.append(("metadata.labels", "FieldValueInvalid",
                           f'Invalid value: "{key}": {KEY_MSG}'))
        elif not isinstance(value, str) or not LABEL_VALUE.match(value):
            causes.append(("metadata.labels", "FieldValueInvalid",
                           f'Invalid value: "{value}": {VALUE_MSG}'))
    if res.kind == "Node":
        for i, taint in enumerate((obj.get("spec") or {}).get("taints") or []):
            effect = taint.get("effect")
            if effect not in TAINT_EFFECTS:
                supported = ", ".join(f'"{e}"' for e in TAINT_EFFECTS)
                causes.append((f"spec.taints[{i}].effect", "FieldValueNotSupported",
                               f'Unsupported value: "{effect}": supported values: {supported}'))
            if not taint.get("key"):
                causes.append((f"spec.taints[{i}].key", "FieldValueRequired", "Required value"))
    if causes:
        raise errors.invalid(res.kind, res.group, str(meta.get("name", "")), causes)
