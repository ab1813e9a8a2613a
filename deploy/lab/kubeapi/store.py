"""In-memory object store: one global resourceVersion counter, uids, an event window for
watches, optimistic concurrency (409 on a stale resourceVersion) and a JSON state file.
Stored objects are never changed in place (a write stores a new dict), so controllers read
them without copying (peek, scan); clients always get copies (get, find, select). Indexes by
namespace, label and node (pods' spec.nodeName), as the real API server's watch cache and
informers keep, make a list by one of those and a PDB's pods cost the matching objects only."""
from __future__ import annotations

import copy
import json
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import errors
from .errors import ApiError, Obj
from .resources import RESOURCES, Resource
from .validate import validate

# Watches may resume from any resourceVersion still in this window; older ones get 410.
EVENT_WINDOW = 20000
Event = tuple[int, str, str, Obj]  # (resourceVersion, store key, type, object)
Key = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class Narrow:
    """What a read is known to need, for the indexes: a label selector's key=value
    requirements, a field selector's spec.nodeName=X (the caller still applies its whole
    matcher to what the indexes return)."""
    labels: tuple[tuple[str, str], ...] = ()
    node: str | None = None


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def meta(obj: Obj) -> Obj:
    m: Obj = obj.setdefault("metadata", {})
    return m


def _without_bookkeeping(obj: Obj) -> Obj:
    """The object minus the fields the server owns, to detect no-op updates (a shallow
    view: only compared, never changed)."""
    clean = dict(obj)
    clean["metadata"] = {k: v for k, v in meta(obj).items()
                         if k not in ("resourceVersion", "managedFields", "generation")}
    return clean


def controller_uids(obj: Obj) -> set[str]:
    """The uids of the object's controllers (ownerReferences with controller: true)."""
    return {str(r.get("uid")) for r in meta(obj).get("ownerReferences") or []
            if r.get("controller")}


def _entries(key: str, at: Key, obj: Obj, store: Store) -> Iterable[tuple[dict[Any, set[Key]],
                                                                           Any]]:
    """Where an object stands in each index: its controllers, namespace, labels, node."""
    for uid in controller_uids(obj):
        yield store.owned[key], uid
    yield store.in_ns[key], at[0]
    for label, value in (meta(obj).get("labels") or {}).items():
        yield store.labelled[key], (label, str(value))
    node = (obj.get("spec") or {}).get("nodeName") if isinstance(obj.get("spec"), dict) else None
    if node:
        yield store.on_node[key], str(node)


def _spec_part(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


class Store:
    def __init__(self, state_file: Path | None = None) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.rv = 0
        self.objects: dict[str, dict[tuple[str, str], Obj]] = {r.key: {} for r in RESOURCES}
        # Per resource: controller uid -> the keys of the objects it controls (for scan_owned).
        self.owned: dict[str, dict[str, set[Key]]] = {r.key: {} for r in RESOURCES}
        # Per resource: namespace, (label, value), spec.nodeName -> the keys of the objects.
        self.in_ns: dict[str, dict[str, set[Key]]] = {r.key: {} for r in RESOURCES}
        self.labelled: dict[str, dict[tuple[str, str], set[Key]]] = {
            r.key: {} for r in RESOURCES}
        self.on_node: dict[str, dict[str, set[Key]]] = {r.key: {} for r in RESOURCES}
        self.events: deque[Event] = deque(maxlen=EVENT_WINDOW)
        self.state_file = state_file
        self.dirty = False

    # --- persistence ---------------------------------------------------------

    def load(self, data: Obj) -> None:
        with self.lock:
            self.rv = int(data.get("resourceVersion", 0))
            for key, items in data.get("objects", {}).items():
                for index in (self.objects, self.owned, self.in_ns, self.labelled,
                              self.on_node):
                    index.setdefault(key, {})
                for obj in items:
                    m = meta(obj)
                    self._put(key, (m.get("namespace", ""), m["name"]), obj)

    def snapshot(self) -> Obj:
        """The whole state, sharing the stored objects: read-only (they never change)."""
        with self.lock:
            objects = {k: list(v.values()) for k, v in self.objects.items()}
            return {"resourceVersion": self.rv, "objects": objects}

    def save(self) -> None:
        """Write the state file when something changed since the last save."""
        if self.state_file is None:
            return
        with self.lock:
            if not self.dirty:
                return
            data = self.snapshot()
            self.dirty = False
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, sort_keys=True))
        tmp.replace(self.state_file)

    # --- reads ---------------------------------------------------------------

    def current_rv(self) -> str:
        with self.lock:
            return str(self.rv)

    def get(self, res: Resource, ns: str, name: str) -> Obj:
        with self.lock:
            obj = self.objects[res.key].get((ns, name))
            if obj is None:
                raise errors.not_found(res.group, res.plural, name)
            return copy.deepcopy(obj)

    def find(self, res: Resource, ns: str, name: str) -> Obj | None:
        """Like get, but None when missing (for controllers)."""
        with self.lock:
            obj = self.objects[res.key].get((ns, name))
            return copy.deepcopy(obj) if obj is not None else None

    def select(self, res: Resource, ns: str | None = None,
               match: Callable[[Obj], bool] | None = None,
               narrow: Narrow | None = None) -> tuple[list[Obj], str]:
        with self.lock:
            bucket = self.objects[res.key]
            keys = sorted(self._candidates(res.key, ns, narrow or Narrow()))
            items = [o for o in (bucket[k] for k in keys) if match is None or match(o)]
            return copy.deepcopy(items), str(self.rv)

    def _candidates(self, key: str, ns: str | None, narrow: Narrow) -> Iterable[Key]:
        """The keys the indexes allow (a superset of the matches), the smallest set: all of
        the resource, its namespace's, a label's or a node's (lock held)."""
        sets: list[set[Key]] = []
        if ns is not None:
            sets.append(self.in_ns[key].get(ns, set()))
        if narrow.node is not None:
            sets.append(self.on_node[key].get(narrow.node, set()))
        sets += [self.labelled[key].get(pair, set()) for pair in narrow.labels]
        if not sets:
            return self.objects[key].keys()
        smallest = min(sets, key=len)
        return [k for k in smallest if all(k in other for other in sets)]

    # --- read-only views for controllers: the stored objects themselves ----------

    def peek(self, res: Resource, ns: str, name: str) -> Obj | None:
        """The stored object or None; the caller must not change it."""
        with self.lock:
            return self.objects[res.key].get((ns, name))

    def scan(self, res: Resource, ns: str | None = None,
             match: Callable[[Obj], bool] | None = None,
             narrow: Narrow | None = None) -> list[Obj]:
        """Like select without the copies (nor the resourceVersion); the caller must not
        change the objects. A write meanwhile stores a new dict: these stay as they were."""
        with self.lock:
            bucket = self.objects[res.key]
            found = [(key, bucket[key])
                     for key in self._candidates(res.key, ns, narrow or Narrow())
                     if match is None or match(bucket[key])]
        found.sort(key=lambda item: item[0])  # the order select lists in
        return [o for _, o in found]

    def scan_owned(self, res: Resource, ns: str, uid: str) -> list[Obj]:
        """Like scan for the objects in ns that the object with this uid controls."""
        with self.lock:
            bucket = self.objects[res.key]
            keys = sorted(k for k in self.owned[res.key].get(uid, ()) if k[0] == ns)
            return [bucket[k] for k in keys]

    # --- the one place objects enter and leave the buckets (keeps the index) -----

    def _put(self, key: str, at: Key, obj: Obj) -> None:
        self._drop(key, at)
        self.objects[key][at] = obj
        for index, entry in _entries(key, at, obj, self):
            index.setdefault(entry, set()).add(at)

    def _drop(self, key: str, at: Key) -> Obj | None:
        obj = self.objects[key].pop(at, None)
        for index, entry in _entries(key, at, obj, self) if obj is not None else ():
            keys = index[entry]
            keys.discard(at)
            if not keys:
                del index[entry]
        return obj

    # --- writes --------------------------------------------------------------

    def _emit(self, res: Resource, kind: str, obj: Obj) -> None:
        self.events.append((self.rv, res.key, kind, copy.deepcopy(obj)))
        self.dirty = True
        self.changed.notify_all()

    def _stamp(self, res: Resource, obj: Obj) -> None:
        self.rv += 1
        obj["apiVersion"], obj["kind"] = res.api_version, res.kind
        meta(obj)["resourceVersion"] = str(self.rv)

    def create(self, res: Resource, ns: str, obj: Obj, dry_run: bool = False) -> Obj:
        obj = copy.deepcopy(obj)
        m = meta(obj)
        if not m.get("name") and m.get("generateName"):
            m["name"] = m["generateName"] + uuid.uuid4().hex[:5]
        name = m.get("name")
        if not name:
            raise errors.invalid(res.kind, res.group, "", [
                ("metadata.name", "FieldValueRequired",
                 "Required value: name or generateName is required")])
        if res.namespaced:
            if m.get("namespace", ns) != ns:
                raise errors.bad_request("the namespace of the provided object does not match "
                                         "the namespace sent on the request")
            m["namespace"] = ns
        else:
            m.pop("namespace", None)
        validate(res, obj)
        with self.lock:
            if res.namespaced and ("", ns) not in self.objects.get("namespaces", {}):
                raise errors.not_found("", "namespaces", ns)  # as the real API answers
            bucket = self.objects[res.key]
            if (ns, name) in bucket:
                raise errors.already_exists(res.group, res.plural, name)
            m.update(uid=str(uuid.uuid4()), creationTimestamp=now_iso(), generation=1)
            m.pop("resourceVersion", None)
            if dry_run:
                obj["apiVersion"], obj["kind"] = res.api_version, res.kind
                return obj
            self._stamp(res, obj)
            self._put(res.key, (ns, name), obj)
            self._emit(res, "ADDED", obj)
            return copy.deepcopy(obj)

    def replace(self, res: Resource, ns: str, name: str, obj: Obj,
                dry_run: bool = False) -> Obj:
        """PUT semantics: a resourceVersion in the body must match the stored one."""
        obj = copy.deepcopy(obj)
        m = meta(obj)
        if m.get("name", name) != name:
            raise errors.bad_request(f"the name of the object ({m.get('name')}) does not match "
                                     f"the name on the URL ({name})")
        with self.lock:
            bucket = self.objects[res.key]
            current = bucket.get((ns, name))
            if current is None:
                raise errors.not_found(res.group, res.plural, name)
            cm = meta(current)
            wanted = m.get("resourceVersion")
            if wanted and wanted != cm["resourceVersion"]:
                raise errors.conflict(res.group, res.plural, name)
            m.update(name=name, uid=cm["uid"], creationTimestamp=cm["creationTimestamp"])
            if res.namespaced:
                m["namespace"] = ns
            for key in ("deletionTimestamp", "deletionGracePeriodSeconds"):
                if key in cm:
                    m[key] = cm[key]
            generation = int(cm.get("generation", 1))
            m["generation"] = generation + (_spec_part(obj) != _spec_part(current))
            obj["apiVersion"], obj["kind"] = res.api_version, res.kind
            validate(res, obj)
            if _without_bookkeeping(obj) == _without_bookkeeping(current):
                return copy.deepcopy(current)  # a no-op update keeps its resourceVersion
            if dry_run:
                return obj
            self._stamp(res, obj)
            self._put(res.key, (ns, name), obj)
            self._emit(res, "MODIFIED", obj)
            return copy.deepcopy(obj)

    def modify(self, res: Resource, ns: str, name: str, change: Callable[[Obj], Any],
               expected_rv: str | None = None, dry_run: bool = False) -> Obj:
        """Read, change a copy, write it back under one lock (patches, controllers)."""
        with self.lock:
            current = self.get(res, ns, name)
            if expected_rv and expected_rv != meta(current)["resourceVersion"]:
                raise errors.conflict(res.group, res.plural, name)
            updated = change(current)
            if updated is None:
                updated = current
            meta(updated).pop("resourceVersion", None)
            return self.replace(res, ns, name, updated, dry_run=dry_run)

    def delete(self, res: Resource, ns: str, name: str, dry_run: bool = False) -> Obj:
        with self.lock:
            bucket = self.objects[res.key]
            obj = bucket.get((ns, name))
            if obj is None:
                raise errors.not_found(res.group, res.plural, name)
            if dry_run:
                return copy.deepcopy(obj)
            self._drop(res.key, (ns, name))
            obj = copy.deepcopy(obj)  # stamp a copy: readers may still hold the stored one
            self._stamp(res, obj)
            self._emit(res, "DELETED", obj)
            return copy.deepcopy(obj)

    def mark_deleting(self, res: Resource, ns: str, name: str, grace: int) -> Obj:
        """Graceful deletion: set deletionTimestamp; a controller removes it later."""
        def change(obj: Obj) -> None:
            meta(obj).setdefault("deletionTimestamp", now_iso())
            meta(obj).setdefault("deletionGracePeriodSeconds", grace)
        return self.modify(res, ns, name, change)

    # --- watch ---------------------------------------------------------------

    def events_after(self, rv: int, key: str, timeout: float) -> list[Event]:
        """Events of one resource after rv; waits up to timeout for the first one."""
        with self.lock:
            if self.events and rv < self.events[0][0] - 1 and len(self.events) == EVENT_WINDOW:
                raise ApiError(410, "Expired", f"too old resource version: {rv} "
                               f"({self.events[0][0] - 1})")
            found = [e for e in self.events if e[0] > rv and e[1] == key]
            if not found:
                self.changed.wait(timeout)
                found = [e for e in self.events if e[0] > rv and e[1] == key]
            return found
