"""``promql:`` and ``alerts:`` checks, against the configured Prometheus and Alertmanager.

They only read, and fail closed: a query without data or a source not answering fails the
check, never passes it. Polling (``for:``) is done by bot.execution.checks.core, not here.
"""

from __future__ import annotations

from typing import Any

from adapters.actions import ActionError
from adapters.alertmanager import AlertmanagerBackend
from adapters.prometheus import Expectation, PrometheusBackend, judge
from adapters.prometheus.verdict import SHOWN
from bot.execution.checks.core import Outcome
from bot.execution.planning import PlannedCheck

MAX_SHOWN = SHOWN  # failing series named in a verdict


class PromqlEvaluator:
    """Evaluates a ``promql:`` check::

        promql: 'max(DCGM_FI_DEV_GPU_UTIL{Hostname="{{ node }}"})'
        expect: "< 5"                 # every returned series must satisfy it
        for: 1m                       # and keep satisfying it, polled

    Every series is judged on its own, by its whole label set (adapters.prometheus.verdict):
    one failing series fails the check, whatever labels it shares with passing ones, and
    the failure names each failing series (the first ``MAX_SHOWN``) with its value. No data
    fails the check ("no data for <query>"); Prometheus not answering fails it with the
    reason.
    """

    def __init__(self, backend: PrometheusBackend) -> None:
        self._backend = backend

    def __call__(self, check: PlannedCheck, deadline: float) -> Outcome:
        query = str(check.spec["promql"])
        expect = Expectation.parse(check.expect or "== 0")
        try:
            samples = self._backend.query(query, timeout=check.timeout_seconds)
        except ActionError as exc:
            return Outcome(False, None, str(exc))
        verdict = judge(samples, expect)
        if not verdict.samples:
            return Outcome(False, None, f"no data for {query}")
        if not verdict.passed:
            failing = {s.series_text(): s.value for s in verdict.failing[:MAX_SHOWN]}
            return Outcome(False, failing, verdict.failure())
        values = [s.value for s in verdict.samples]
        seen: Any = values[0] if len(values) == 1 else {
            "series": len(values), "min": min(values), "max": max(values)}
        return Outcome(True, seen, f"{len(values)} series {expect}")


class AlertsEvaluator:
    """Evaluates an ``alerts:`` check: no such alert may be firing::

        alerts: {node: "{{ node }}", severity: critical}

    Alertmanager not answering fails it with the reason. Pending alerts (from Prometheus,
    when configured) are reported, never fatal.
    """

    def __init__(self, alertmanager: AlertmanagerBackend,
                 prometheus: PrometheusBackend | None = None) -> None:
        self._alertmanager = alertmanager
        self._prometheus = prometheus

    def __call__(self, check: PlannedCheck, deadline: float) -> Outcome:
        labels = {str(k): str(v) for k, v in dict(check.spec["alerts"]).items()}
        try:
            firing = self._alertmanager.alerts(labels)
        except ActionError as exc:
            return Outcome(False, None, str(exc))
        pending = self._pending(labels)
        names = sorted({a.labels.get("alertname", "?") for a in firing})
        note = f"; pending: {', '.join(pending)}" if pending else ""
        if firing:
            return Outcome(False, len(firing), f"firing: {', '.join(names)}{note}",
                           {"firing": [dict(a.labels) for a in firing], "pending": pending})
        return Outcome(True, 0, f"no alert firing for {labels}{note}", {"pending": pending})

    def _pending(self, labels: dict[str, str]) -> list[str]:
        if self._prometheus is None:
            return []
        try:
            alerts = self._prometheus.alerts()
        except ActionError:
            return []  # only a note: Alertmanager already answered the question
        return sorted({
            str(a.get("labels", {}).get("alertname")) for a in alerts
            if a.get("state") == "pending"
            and all(a.get("labels", {}).get(k) == v for k, v in labels.items())
        })
