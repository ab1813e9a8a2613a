"""PodDisruptionBudget status (as the disruption controller computes it) and the Eviction
subresource's decision: delete the pod (201), or 429 when the budget forbids it."""
from __future__ import annotations

import math
from typing import Any

from . import errors
from .errors import ApiError, Obj, status_body
from .resources import by_kind
from .selectors import selector_matches
from .store import Narrow, Store, meta, now_iso

PODS, PDBS, RS = by_kind("Pod"), by_kind("PodDisruptionBudget"), by_kind("ReplicaSet")


def pod_ready(pod: Obj) -> bool:
    # Called for every pod on every controller pass: plain reads, no meta() setdefault.
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
        return False
    for c in status.get("conditions") or ():
        if c.get("type") == "Ready" and c.get("status") == "True":
            return True
    return False


def _int_or_percent(value: Any, total: int, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        share = int(value[:-1]) * total / 100
        return math.ceil(share) if round_up else math.floor(share)
    return int(value)


def _controller(pod: Obj) -> Obj | None:
    refs = meta(pod).get("ownerReferences") or []
    return next((r for r in refs if r.get("controller")), None)


def _expected(store: Store, pods: list[Obj]) -> int:
    """Sum of the scale of the pods' controllers; pods without one count themselves."""
    total, seen = 0, set()
    for pod in pods:
        ref = _controller(pod)
        if ref is None:
            total += 1
            continue
        if ref.get("uid") in seen:
            continue
        seen.add(ref.get("uid"))
        owner = store.peek(RS, meta(pod)["namespace"], ref.get("name", "")) \
            if ref.get("kind") == "ReplicaSet" else None
        total += int(owner.get("spec", {}).get("replicas", 1)) if owner else 1
    return total


def matching_pods(store: Store, pdb: Obj) -> list[Obj]:
    """The budget's pods, found as the disruption controller's informer finds them: from
    the label index (its matchLabels), then the whole selector on those only."""
    selector = pdb.get("spec", {}).get("selector")
    pairs = tuple((k, str(v)) for k, v in ((selector or {}).get("matchLabels") or {}).items())
    return store.scan(PODS, meta(pdb)["namespace"],
                      lambda p: selector_matches(selector, meta(p).get("labels") or {}),
                      Narrow(labels=pairs))


def compute_status(store: Store, pdb: Obj) -> Obj:
    spec = pdb.get("spec", {})
    pods = matching_pods(store, pdb)
    healthy = sum(pod_ready(p) for p in pods)
    if "maxUnavailable" in spec:
        expected = _expected(store, pods)
        desired = max(0, expected - _int_or_percent(spec["maxUnavailable"], expected, True))
    elif isinstance(spec.get("minAvailable"), str):
        expected = _expected(store, pods)
        desired = _int_or_percent(spec["minAvailable"], expected, True)
    else:
        expected, desired = len(pods), int(spec.get("minAvailable", 1))
    allowed = max(0, healthy - desired)
    old = pdb.get("status", {})
    condition = {
        "type": "DisruptionAllowed", "status": "True" if allowed else "False",
        "reason": "SufficientPods" if allowed else "InsufficientPods", "message": "",
        "observedGeneration": meta(pdb).get("generation", 1),
        "lastTransitionTime": now_iso(),
    }
    for c in old.get("conditions") or []:
        if c.get("type") == "DisruptionAllowed" and c.get("status") == condition["status"]:
            condition["lastTransitionTime"] = c.get("lastTransitionTime")
    return {"observedGeneration": meta(pdb).get("generation", 1),
            "disruptionsAllowed": allowed, "currentHealthy": healthy,
            "desiredHealthy": desired, "expectedPods": expected, "conditions": [condition]}


def refresh(store: Store, pdbs: list[Obj] | None = None) -> None:
    """Recompute the status of ``pdbs`` (default: every PDB); writes (and bumps
    resourceVersion) only on change."""
    for pdb in store.scan(PDBS) if pdbs is None else pdbs:
        status = compute_status(store, pdb)
        if status != pdb.get("status"):
            def change(obj: Obj, status: Obj = status) -> None:
                obj["status"] = status
            store.modify(PDBS, meta(pdb)["namespace"], meta(pdb)["name"], change)


def _budget_error(pdb: Obj, status: Obj) -> ApiError:
    name = meta(pdb)["name"]
    cause = (f"The disruption budget {name} needs {status['desiredHealthy']} healthy pods and "
             f"has {status['currentHealthy']} currently")
    return ApiError(429, "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    {"causes": [{"reason": "DisruptionBudget", "message": cause}]})


def evict(store: Store, ns: str, name: str, body: Obj, dry_run: bool,
          delete: Any) -> Obj:
    """Decide under the store lock, so two evictions can't spend one disruption."""
    if body.get("kind") not in (None, "Eviction"):
        raise errors.bad_request(f"expected Eviction, got {body.get('kind')}")
    if meta(body).get("name", name) != name:
        raise errors.bad_request("name in URL does not match name in Eviction object")
    options = body.get("deleteOptions") or {}
    with store.lock:
        pod = store.get(PODS, ns, name)
        labels = meta(pod).get("labels") or {}
        # the namespace's budgets only (the API server's PDB lister is by namespace)
        pdbs = store.scan(PDBS, ns, lambda p: selector_matches(
            p.get("spec", {}).get("selector"), labels))
        if not _ignores_budget(pod):
            if len(pdbs) > 1:
                raise errors.internal("This pod has more than one PodDisruptionBudget, which "
                                      "the eviction subresource does not support.")
            if pdbs:
                status = compute_status(store, pdbs[0])
                unhealthy_ok = (not pod_ready(pod)
                                and status["currentHealthy"] >= status["desiredHealthy"] > 0)
                if status["disruptionsAllowed"] <= 0 and not unhealthy_ok:
                    raise _budget_error(pdbs[0], status)
        if not dry_run:
            delete(ns, name, options.get("gracePeriodSeconds"))
            # only the budgets that select the pod change (the API server's disruption
            # controller too watches pods, not every budget on every eviction)
            refresh(store, pdbs)
    return status_body("Success", 201)


def _ignores_budget(pod: Obj) -> bool:
    phase = pod.get("status", {}).get("phase")
    return bool(meta(pod).get("deletionTimestamp")) or phase in ("Succeeded", "Failed", "Pending")
