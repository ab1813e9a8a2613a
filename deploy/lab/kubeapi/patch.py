"""The three patch types of the API: JSON merge (RFC 7386), JSON patch (RFC 6902) and
strategic merge (merge keys per field path, `$patch` directives), as apply functions."""
from __future__ import annotations

import copy
from typing import Any

from .errors import ApiError, Obj

# Strategic merge: list fields merged by a key, keyed by field path (lists of a
# kind not named here are atomic and replaced whole, like NodeSpec.taints and
# PodSpec.tolerations in the real schema).
MERGE_KEYS = {
    "metadata.ownerReferences": "uid",
    "spec.containers": "name",
    "spec.initContainers": "name",
    "spec.template.spec.containers": "name",
    "spec.template.spec.initContainers": "name",
    "spec.volumes": "name",
    "spec.template.spec.volumes": "name",
    "status.conditions": "type",
    "status.addresses": "type",
    "status.containerStatuses": "name",
}
# Lists of scalars merged as sets (patchStrategy: merge without key).
MERGE_SCALARS = {"metadata.finalizers", "spec.podCIDRs"}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"JSON pointer must start with /: {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        if isinstance(doc, list):
            doc = doc[int(part)]
        elif isinstance(doc, dict):
            doc = doc[part]
        else:
            raise KeyError(part)
    return doc


def _json_op(doc: Any, op: Obj) -> Any:
    kind, parts = op.get("op"), _pointer(op.get("path", ""))
    if kind == "test":
        if _walk(doc, parts) != op.get("value"):
            raise ValueError(f"testing value {op.get('path')} failed")
        return doc
    if kind in ("move", "copy"):
        src = _pointer(op.get("from", ""))
        value = copy.deepcopy(_walk(doc, src))
        if kind == "move":
            doc = _json_op(doc, {"op": "remove", "path": op["from"]})
        return _json_op(doc, {"op": "add", "path": op["path"], "value": value})
    if not parts:
        return copy.deepcopy(op.get("value")) if kind in ("add", "replace") else None
    parent, last = _walk(doc, parts[:-1]), parts[-1]
    if kind == "add":
        if isinstance(parent, list):
            parent.insert(len(parent) if last == "-" else int(last), copy.deepcopy(op["value"]))
        else:
            parent[last] = copy.deepcopy(op["value"])
    elif kind == "remove":
        del parent[int(last) if isinstance(parent, list) else last]
    elif kind == "replace":
        if isinstance(parent, list):
            parent[int(last)] = copy.deepcopy(op["value"])
        else:
            if last not in parent:
                raise KeyError(last)
            parent[last] = copy.deepcopy(op["value"])
    else:
        raise ValueError(f"unexpected op {kind!r}")
    return doc


def json_patch(target: Obj, ops: Any) -> Obj:
    if not isinstance(ops, list):
        raise ApiError(400, "BadRequest",
                       "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc: Any = copy.deepcopy(target)
    for op in ops:
        try:
            doc = _json_op(doc, op)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise ApiError(422, "Invalid",
                           f"the server rejected our request due to an error in our request: "
                           f"{exc}") from None
    if not isinstance(doc, dict):
        raise ApiError(422, "Invalid", "the patch did not produce an object")
    result: Obj = doc
    return result


def strategic_merge(target: Any, patch: Any, path: str = "") -> Any:
    """Strategic merge patch for the built-in kinds this server serves."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return None
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in ("$retainKeys", "$patch"):
            continue  # ordering hints and retainKeys change nothing we store
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            result[name] = [x for x in result.get(name) or [] if x not in value]
            continue
        sub = f"{path}.{key}" if path else key
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list):
            result[key] = _merge_list(result.get(key), value, sub)
        else:
            merged = strategic_merge(result.get(key), value, sub)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
    return result


def _merge_list(current: Any, patch: list[Any], path: str) -> list[Any]:
    current = list(current) if isinstance(current, list) else []
    if path in MERGE_SCALARS:
        return current + [x for x in patch if x not in current]
    key = MERGE_KEYS.get(path)
    if key is None:
        return [x for x in copy.deepcopy(patch) if not (isinstance(x, dict) and "$patch" in x)]
    for item in patch:
        if not isinstance(item, dict):
            continue
        if item.get("$patch") == "replace":
            return [x for x in copy.deepcopy(patch) if x.get("$patch") is None]
        index = next((i for i, x in enumerate(current)
                      if isinstance(x, dict) and x.get(key) == item.get(key)), None)
        if item.get("$patch") == "delete":
            if index is not None:
                current.pop(index)
        elif index is None:
            current.append(strategic_merge({}, item, path))
        else:
            current[index] = strategic_merge(current[index], item, path)
    return current
