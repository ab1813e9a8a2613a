"""``GpuGate``: before a node goes back into service, its GPUs as DCGM reports them through
Prometheus: every GPU it should have reports (a GPU off the bus has no series), no GPU
alert of the shipped rules fires for it, and for a settle time its XID and ECC counters do
not rise. Fail closed: no series at all, or Prometheus not answering, fails the gate.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from typing import Any

from adapters.actions import ActionContext, ActionError
from adapters.prometheus.backend import PrometheusBackend, PrometheusError
from adapters.prometheus.soak import HOST_LABELS, ErrorWatch
from adapters.prometheus.template import build
from kit.durations import format_duration

DEFAULT_SETTLE = 120.0  # seconds a node's GPUs are watched (prometheus.gpu_settle)
PRESENCE = "DCGM_FI_DEV_GPU_TEMP"  # every GPU dcgm-exporter sees reports a temperature
GPU_ALERTS = re.compile(r"^(Gpu|DcgmExporter)")  # deploy/prometheus/gpu-alerts.yaml
ALERT_HOST_LABELS = ("node", *HOST_LABELS)


def configured_settle(prometheus: object) -> float:
    """The settle time the configuration gives (prometheus.gpu_settle), else the default."""
    return float(getattr(getattr(prometheus, "config", None), "gpu_settle", DEFAULT_SETTLE))


class GpuGated:
    """An action whose check ends with the GPU gate: it holds Prometheus (None when not
    configured) and the configured settle time, handed in by its adapter."""

    def __init__(self, *args: Any, prometheus: PrometheusBackend | None = None,
                 gpu_settle: float = DEFAULT_SETTLE, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.prometheus, self.gpu_settle = prometheus, gpu_settle

    def settle_for(self, asked: float | None) -> float:
        """The settle time a request asked for, else the configured one."""
        return self.gpu_settle if asked is None else asked


def build_actions(classes: Iterable[type[Any]], backend: Any, config: Any,
                  prometheus: PrometheusBackend | None) -> list[Any]:
    """An adapter's actions, each class over its backend and configuration; the GPU-gated
    ones also get Prometheus (None when not configured: they refuse then) and its settle."""
    settle = configured_settle(prometheus)
    return [cls(backend, config, prometheus=prometheus, gpu_settle=settle)
            if issubclass(cls, GpuGated) else cls(backend, config) for cls in classes]


def gate_for(prometheus: PrometheusBackend | None, node: str, expect: int,
             what: str) -> GpuGate:
    """The gate over ``prometheus``; refused, saying what to do, when none is configured
    (``what``: the step whose check the gate belongs to, for the message)."""
    if prometheus is None:
        raise ActionError(
            f"{what} also checks {node}'s GPUs in Prometheus (DCGM), and no Prometheus is "
            "configured: configure prometheus:, or ask again with gpu_telemetry=false "
            "(break-glass: the node then returns on the check alone)")
    return GpuGate(prometheus, node, expect)


class GateFailed(ActionError):
    """The node's GPUs failed the gate; the text is the verdict (a drain reason)."""


class GpuGate:
    def __init__(self, backend: PrometheusBackend, node: str, expect: int,
                 poll: float = 2.0) -> None:
        self.backend, self.node, self.expect, self.poll = backend, node, expect, poll

    def describe(self, settle: float) -> str:
        return (f"DCGM in Prometheus: {self.expect} GPU(s) of {self.node} report "
                f"({PRESENCE}), no GPU alert fires for it, and for "
                f"{format_duration(settle)} no XID or ECC counter of it rises; else it is "
                "drained again with the verdict")

    def _ask(self, what: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except PrometheusError as exc:
            raise GateFailed(f"Prometheus did not answer ({what}): {exc}") from exc

    def presence(self) -> str | None:
        """What is missing, or None when every expected GPU reports."""
        query = build(" or ".join(f'{PRESENCE}{{{label}="$node"}}' for label in HOST_LABELS),
                      node=self.node)
        samples = self._ask("GPU series", lambda: self.backend.query(query, timeout=30))
        seen = sorted({int(s.labels["gpu"]) for s in samples if s.labels.get("gpu", "").isdigit()})
        if not seen:
            return (f"DCGM reports no GPU of {self.node} (its dcgm-exporter down, or not "
                    f"scraped): {self.expect} expected")
        missing = [g for g in range(self.expect) if g not in seen]
        if missing or len(seen) < self.expect:
            named = ", ".join(map(str, missing)) or "?"
            return (f"DCGM reports {len(seen)} of {self.expect} GPUs of {self.node}: GPU "
                    f"{named} missing (off the bus?)")
        return None

    def firing(self) -> list[str]:
        alerts = self._ask("alerts", lambda: self.backend.alerts(timeout=30))
        found = []
        for alert in alerts:
            labels = alert.get("labels") or {}
            mine = any(labels.get(key) == self.node for key in ALERT_HOST_LABELS)
            if (mine and alert.get("state") == "firing"
                    and GPU_ALERTS.match(str(labels.get("alertname", "")))):
                extra = " ".join(f"{k}={labels[k]}" for k in ("gpu", "xid") if k in labels)
                found.append(f"{labels['alertname']} firing" + (f" ({extra})" if extra else ""))
        return found

    def check(self, settle: float, ctx: ActionContext,
              sleep: Callable[[float], None]) -> int:
        """Presence and alerts now, then the error counters and alerts for ``settle``
        seconds; GateFailed with the verdict at the first problem. Returns the reads."""
        self.now()
        watch = ErrorWatch(self.backend, [self.node])
        try:
            watch.start()
        except ActionError as exc:
            raise GateFailed(str(exc)) from exc
        ends, reads = time.monotonic() + settle, 1
        while time.monotonic() < ends:
            ctx.checkpoint(f"watching {self.node}'s GPUs settle")
            sleep(max(0.01, ctx.pause(min(self.poll, ends - time.monotonic()))))
            try:
                rising = watch.problems()
            except ActionError as exc:
                raise GateFailed(str(exc)) from exc
            if rising:
                raise GateFailed("new GPU errors while settling: " + "; ".join(rising[:5]))
            self.now()
            reads += 1
        return reads

    def now(self) -> None:
        """Presence and alerts as they are; GateFailed with the verdict."""
        problem = self.presence()
        if problem:
            raise GateFailed(problem)
        firing = self.firing()
        if firing:
            raise GateFailed(f"GPU alert(s) for {self.node}: " + "; ".join(firing[:5]))


def gate_nodes(backend: PrometheusBackend, expect: dict[str, int], settle: float,
               ctx: ActionContext, sleep: Callable[[float], None],
               poll: float = 2.0) -> dict[str, str]:
    """The gate over a set of nodes at once (resume-nodes): presence and alerts of each, then
    one watch of all their XID/ECC counters for ``settle``, then presence and alerts again.
    Returns each failing node's verdict; a node not named passed. Fail closed: a node
    without error series fails, and Prometheus not answering fails every node still judged."""
    gates = {node: GpuGate(backend, node, count, poll) for node, count in expect.items()}
    failed = _now_failing(gates)
    judged = [node for node in gates if node not in failed]
    if not judged:
        return failed
    watch = ErrorWatch(backend, judged)
    try:  # a node without error series fails with its own verdict, the others are watched
        failed.update({node: f"no XID/ECC error series of {node} in Prometheus (its "
                       "dcgm-exporter not scraped?): its errors cannot be watched"
                       for node in watch.start(leave_unseen=True)})
        judged = list(watch.nodes)
        ends = time.monotonic() + settle if judged else 0.0
        while time.monotonic() < ends and len(failed) < len(gates):
            ctx.checkpoint(f"watching the GPUs of {len(judged)} node(s) settle")
            sleep(max(0.01, ctx.pause(min(poll, ends - time.monotonic()))))
            for problem in watch.problems():
                node = problem.split(":", 1)[0]
                if node in gates and node not in failed:
                    failed[node] = f"new GPU errors while settling: {problem}"
    except ActionError as exc:
        return {**failed, **{node: str(exc) for node in judged if node not in failed}}
    return {**failed, **_now_failing({n: g for n, g in gates.items() if n not in failed})}


def _now_failing(gates: dict[str, GpuGate]) -> dict[str, str]:
    failed = {}
    for node, gate in gates.items():
        try:
            gate.now()
        except GateFailed as exc:
            failed[node] = str(exc)
    return failed
