"""``promql:`` and ``alerts:`` checks, against the configured Prometheus and Alertmanager.

They only read, and fail closed: a query without data or a source not answering fails the
check, never passes it. Polling (``for:``) is done by bot.execution.checks.core, not here.
"""

from __future__ import annotations

from typing import Any

from adapters.actions import ActionError
from adapters.alertmanager.backend import Alert, AlertmanagerBackend, Silence
from adapters.prometheus.backend import PrometheusBackend
from adapters.prometheus.promql import Expectation
from adapters.prometheus.verdict import SHOWN, judge
from bot.execution.checks.core import Outcome
from bot.execution.planning import PlannedCheck

MAX_SHOWN = SHOWN  # failing series named in a verdict; silenced alerts named in a failure
MAX_COMMENT = 100  # characters of a silence's comment in a failure


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
        include_silenced: false       # optional: silenced and inhibited alerts do not count

    A silenced or inhibited alert is still firing, and counts unless the check says
    ``include_silenced: false``: the bot's own maintenance-window silence must not hide a
    failing GPU from the check that decides whether work goes on. A failure names each
    silence that hid a counted alert (its ID, who made it and why). Alertmanager not
    answering fails it with the reason. Pending alerts (from Prometheus, when configured)
    are reported, never fatal.
    """

    def __init__(self, alertmanager: AlertmanagerBackend,
                 prometheus: PrometheusBackend | None = None) -> None:
        self._alertmanager = alertmanager
        self._prometheus = prometheus

    def __call__(self, check: PlannedCheck, deadline: float) -> Outcome:
        labels = {str(k): str(v) for k, v in dict(check.spec["alerts"]).items()}
        counted = check.spec.get("include_silenced", True) is not False
        try:
            firing = self._alertmanager.alerts(labels, silenced=counted, inhibited=counted)
        except ActionError as exc:
            return Outcome(False, None, str(exc))
        pending = self._pending(labels)
        names = sorted({a.labels.get("alertname", "?") for a in firing})
        note = f"; pending: {', '.join(pending)}" if pending else ""
        if firing:
            suppressed, silences = self._suppressed(firing)
            return Outcome(False, len(firing), f"firing: {', '.join(names)}{suppressed}{note}",
                           {"firing": [dict(a.labels) for a in firing], "pending": pending,
                            "silences": silences})
        ignored = "" if counted else " (silenced and inhibited alerts not counted)"
        return Outcome(True, 0, f"no alert firing for {labels}{ignored}{note}",
                       {"pending": pending})

    def _suppressed(self, firing: list[Alert]) -> tuple[str, list[dict[str, Any]]]:
        """The counted alerts that a silence or an inhibition hides, as text (each silence
        by ID, creator and comment), and the silences for the audit log."""
        silenced = [a for a in firing if a.silenced_by][:MAX_SHOWN]
        inhibited = [a for a in firing if a.inhibited_by and not a.silenced_by][:MAX_SHOWN]
        ids = list(dict.fromkeys(i for a in silenced for i in a.silenced_by))[:MAX_SHOWN]
        found = {i: self._silence(i) for i in ids}
        parts = []
        if silenced:
            parts.append("; silenced, counted all the same: " + ", ".join(
                f"{_name(a)} by " + ", ".join(_described(i, found.get(i)) for i in a.silenced_by)
                for a in silenced))
        if inhibited:
            by_fingerprint = {a.fingerprint: _name(a) for a in firing}
            parts.append("; inhibited, counted all the same: " + ", ".join(
                f"{_name(a)} by " + ", ".join(by_fingerprint.get(f, f"alert {f}")
                                              for f in a.inhibited_by)
                for a in inhibited))
        if parts:
            parts.append(" (include_silenced: false ignores them)")
        silences = [s.as_dict() if isinstance(s, Silence) else {"silence_id": i, "problem": s}
                    for i, s in found.items()]
        return "".join(parts), silences

    def _silence(self, silence_id: str) -> Silence | str:
        """The silence, or why it cannot be shown (the check fails all the same)."""
        try:
            found = self._alertmanager.get_silence(silence_id)
        except ActionError as exc:
            return f"not readable: {exc}"
        return found if found is not None else "not found"

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


def _name(alert: Alert) -> str:
    """An alert as a failure names it: its alertname, and its node when it has one."""
    name = alert.labels.get("alertname", "?")
    node = alert.labels.get("node") or alert.labels.get("Hostname")
    return f"{name} on {node}" if node else name


def _described(silence_id: str, silence: Silence | str | None) -> str:
    if not isinstance(silence, Silence):
        return f"silence {silence_id}" + (f" ({silence})" if silence else "")
    comment = silence.comment if len(silence.comment) <= MAX_COMMENT else (
        silence.comment[:MAX_COMMENT] + "...")
    return f'silence {silence_id} ({silence.created_by or "nobody"}: "{comment}")'
