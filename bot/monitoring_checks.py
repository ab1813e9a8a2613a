"""``promql:`` and ``alerts:`` checks, against the configured Prometheus and Alertmanager.

    promql: 'max(DCGM_FI_DEV_GPU_UTIL{Hostname="{{ node }}"})'
    expect: "< 5"                 # every returned series must satisfy it
    for: 1m                       # and keep satisfying it, polled

    alerts: {node: "{{ node }}", severity: critical}   # no such alert may be firing

No data fails a promql check ("no data for <query>"); Prometheus or Alertmanager not
answering fails it with the reason. Pending alerts are reported, never fatal.
"""

from __future__ import annotations

from typing import Any

from adapters.actions import ActionError
from adapters.alertmanager import AlertmanagerBackend
from adapters.prometheus import Expectation, PrometheusBackend
from bot.checks import Outcome
from bot.planning import PlannedCheck

MAX_SHOWN = 8  # series named in a verdict


class PromqlEvaluator:
    def __init__(self, backend: PrometheusBackend) -> None:
        self._backend = backend

    def __call__(self, check: PlannedCheck, deadline: float) -> Outcome:
        query = str(check.spec["promql"])
        expect = Expectation.parse(check.expect or "== 0")
        try:
            samples = self._backend.query(query, timeout=check.timeout_seconds)
        except ActionError as exc:
            return Outcome(False, None, str(exc))
        if not samples:
            return Outcome(False, None, f"no data for {query}")
        values = {_name(s.labels): s.value for s in samples}
        wrong = {name: value for name, value in values.items() if not expect(value)}
        shown = dict(list((wrong or values).items())[:MAX_SHOWN])
        if wrong:
            return Outcome(False, shown, f"{len(wrong)} of {len(values)} series not {expect}: "
                                         + ", ".join(f"{k} {v:g}" for k, v in shown.items()))
        return Outcome(True, shown, f"{len(values)} series {expect}")


class AlertsEvaluator:
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


def _name(labels: dict[str, Any]) -> str:
    shown = {k: v for k, v in labels.items() if k in ("Hostname", "hostname", "node", "gpu")}
    return "{" + ",".join(f"{k}={v}" for k, v in sorted(shown.items())) + "}" if shown else "{}"
