"""Faults the bot did not raise, taken in as alerts: a Slurm node drained by someone else
(NHC, a person, Slurm itself; ``SlurmNodeDrained``) and a Kubernetes node whose configured
condition is True (node-problem-detector's; ``KubernetesNodeCondition``). Each becomes an
alert for ``proposing.receive``, so ``alert_rules`` pick the repair and it waits for the
usual approval: one per node and cause (the fingerprint; the cause's start as startsAt), its
labels naming the reason, XID and GPU found in it. A cause gone resolves its proposal.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select

from adapters.slurm import reasons
from bot.alerts import proposing
from bot.alerts.proposing import Proposal, Webhook, WebhookAlert
from bot.service import Service
from bot.store.schema import proposals

SLURM, KUBERNETES = "SlurmNodeDrained", "KubernetesNodeCondition"
_XID = re.compile(r"\bXID[ :=]*(\d{1,3})\b", re.IGNORECASE)
_GPU = re.compile(r"\bGPU[ :#=]*(\d{1,2})\b", re.IGNORECASE)


def _fingerprint(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _labels(alertname: str, node: str, reason: str, source: str) -> dict[str, str]:
    labels = {"alertname": alertname, "node": node, "reason": reason[:200], "source": source}
    for key, pattern in (("xid", _XID), ("gpu", _GPU)):
        found = pattern.search(reason)
        if found:
            labels[key] = found.group(1)
    return labels


def _source(text: str) -> str:
    return "nhc" if text.upper().startswith("NHC") else "slurm-or-person"


def slurm_alerts(service: Service) -> list[WebhookAlert]:
    """A firing alert per drained Slurm node whose reason has another owner's part."""
    backend = service.backends.get("slurm")
    if backend is None or not service.config.remediation.intake.slurm_drains:
        return []
    names = service.inventory.names.get("slurm", {})
    ours = {names.get(name, name): name for name in service.inventory.slurm}
    found = []
    for node in backend.nodes(sorted(ours)):
        if "DRAIN" not in node.flags:
            continue
        foreign = [p.text for p in reasons.parts(node.reason) if p.execution is None]
        if not foreign:
            continue
        name, text = ours.get(node.name, node.name), foreign[0]
        started = (datetime.fromtimestamp(node.reason_time, UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ") if node.reason_time else None)
        found.append(WebhookAlert.model_validate({
            "status": "firing", "labels": _labels(SLURM, name, text, _source(text)),
            "fingerprint": _fingerprint(SLURM, name, text), "startsAt": started}))
    return found


def kubernetes_alerts(service: Service) -> list[WebhookAlert]:
    """A firing alert per Kubernetes node and configured condition type that is True."""
    kinds = service.config.remediation.intake.kubernetes_conditions
    backend = service.backends.get("kubernetes")
    if backend is None or not kinds:
        return []
    names = service.inventory.names.get("kubernetes", {})
    ours = {names.get(name, name): name for name in service.inventory.kubernetes}
    found = []
    for node in (n for n in backend.list_nodes() if n.name in ours):
        for kind in kinds:
            if kind not in node.problems:
                continue
            reason, message, since = node.problems[kind]
            name = ours.get(node.name, node.name)
            labels = {**_labels(KUBERNETES, name, f"{kind}: {message or reason}",
                                "kubernetes"), "condition": kind}
            found.append(WebhookAlert.model_validate({
                "status": "firing", "labels": labels,
                "fingerprint": _fingerprint(KUBERNETES, name, kind, reason),
                "startsAt": since or None}))
    return found


def scan(service: Service) -> list[Proposal]:
    """One pass: the causes found now fire; open proposals of causes no longer there
    resolve. Returns the proposals created or changed."""
    firing = [*slurm_alerts(service), *kubernetes_alerts(service)]
    seen = {alert.fingerprint for alert in firing}
    gone = [WebhookAlert.model_validate({"status": "resolved", "labels": labels,
                                         "fingerprint": fingerprint})
            for fingerprint, labels in _open_intake(service) if fingerprint not in seen]
    alerts = [*firing, *gone][:service.config.server.max_alerts_per_request]
    if not alerts:
        return []
    return proposing.receive(service, Webhook(version="4", status="firing", alerts=alerts))


def _open_intake(service: Service) -> list[tuple[str, dict[str, Any]]]:
    with service.db.connect() as conn:
        rows = conn.execute(select(proposals.c.fingerprint, proposals.c.labels).where(
            proposals.c.alertname.in_([SLURM, KUBERNETES]),
            proposals.c.alert_status == "firing")).all()
    return [(row.fingerprint, json.loads(row.labels)) for row in rows]
