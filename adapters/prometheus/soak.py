"""``prom.gpu_errors_hold`` and ``ErrorWatch``: for a while, no new XID or ECC error on some
nodes' GPUs (dcgm-exporter series in Prometheus), judged against each series' value when
the watch began. A node with no series, or Prometheus not answering, fails (fail closed).
The Slurm driver upgrade's soak (``slurm.driver_upgrade``) uses ``ErrorWatch`` too.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from typing import ClassVar

from pydantic import Field

from adapters.actions import (
    ActionBase,
    ActionContext,
    ActionError,
    ActionResult,
    Seconds,
    StrictArguments,
)
from adapters.prometheus.backend import PrometheusBackend, PrometheusError, Sample
from adapters.prometheus.config import PrometheusConfig
from adapters.prometheus.promql import format_value, series_text
from adapters.prometheus.template import build
from kit import hostlist
from kit.durations import format_duration

# The last XID (gauge), XID events per XID (dcgm-exporter's windowed count), double-bit ECC.
ERROR_METRICS = ("DCGM_FI_DEV_XID_ERRORS", "DCGM_EXP_XID_ERRORS_COUNT",
                 "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")
HOST_LABELS = ("Hostname", "hostname")  # dcgm-exporter: older and newer releases
SHORT_LABELS = ("gpu", "xid", "err_code")  # what a verdict names of a series
METRIC = r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"

Key = tuple[tuple[str, str], ...]


def _key(sample: Sample) -> Key:
    return tuple(sorted(sample.labels.items()))


def _host(sample: Sample) -> str:
    return next((sample.labels[k] for k in HOST_LABELS if k in sample.labels), "")


def _short(labels: dict[str, str]) -> str:
    """``DCGM_EXP_XID_ERRORS_COUNT{gpu="3", xid="79"}``: the labels a person needs (the
    exporter adds a dozen: driver, VBIOS, UUID...)."""
    return series_text({k: v for k, v in labels.items() if k in ("__name__", *SHORT_LABELS)})


class ErrorWatch:
    """``start()`` reads every error series of the nodes once; ``problems()`` reads them
    again and names each series above its starting value (a series that was not there
    counts from 0) and each node that reports no series at all."""

    def __init__(self, backend: PrometheusBackend, nodes: Sequence[str],
                 metrics: Sequence[str] = ERROR_METRICS) -> None:
        self.backend = backend
        self.nodes = list(nodes)
        self.metrics = list(metrics)
        self.baseline: dict[Key, float] = {}

    def query(self) -> str:
        names = "|".join(self.metrics)
        hosts = "|".join(re.escape(n) for n in self.nodes)
        return build(" or ".join(f'{{__name__=~"$names", {label}=~"$hosts"}}'
                                 for label in HOST_LABELS), names=names, hosts=hosts)

    def _read(self) -> tuple[list[Sample], list[str]]:
        try:
            samples = self.backend.query(self.query(), timeout=30)
        except PrometheusError as exc:
            raise ActionError(f"cannot read the GPU error counters from Prometheus: {exc}. "
                              "The soak cannot judge the nodes without them") from exc
        seen = {_host(s) for s in samples}
        return samples, [n for n in self.nodes if n not in seen]

    def start(self, leave_unseen: bool = False) -> list[str]:
        """The baseline. A node without series fails the watch, or with ``leave_unseen``
        leaves it (each node judged on its own): the nodes left are returned."""
        samples, missing = self._read()
        if missing and not leave_unseen:
            raise ActionError(
                f"no DCGM error series ({', '.join(self.metrics)}) for "
                f"{hostlist.compress(missing)} in Prometheus: is its dcgm-exporter scraped? "
                "The soak cannot judge a node it does not see")
        self.nodes = [n for n in self.nodes if n not in missing]
        self.baseline = {_key(s): s.value for s in samples}
        return missing

    def problems(self) -> list[str]:
        samples, missing = self._read()
        found = [f"{n}: no DCGM error series any more (exporter down?)" for n in missing]
        for sample in samples:
            before = self.baseline.get(_key(sample), 0.0)
            if not math.isnan(sample.value) and sample.value > before:
                found.append(f"{_host(sample)}: {_short(sample.labels)} "
                             f"{format_value(before)} -> {format_value(sample.value)}")
        return found

    def hold(self, seconds: float, poll: float, ctx: ActionContext,
             sleep: Callable[[float], None]) -> int:
        """``start`` then ``problems`` every ``poll`` for ``seconds``; ActionError at the
        first problem. Returns how many reads it made."""
        self.start()
        ends = time.monotonic() + seconds
        reads = 1
        while True:
            found = self.problems()
            reads += 1
            if found:
                raise ActionError("new GPU errors during the soak: " + "; ".join(found[:10]))
            if time.monotonic() >= ends:
                return reads
            ctx.checkpoint(f"watching {hostlist.compress(self.nodes)} for new GPU errors")
            sleep(max(0.01, ctx.pause(min(poll, ends - time.monotonic()))))


class ErrorsHoldArguments(StrictArguments):
    nodes: str = Field(min_length=1, description="a hostlist: the nodes' DCGM Hostname")
    duration: Seconds = Field(le=7 * 86400.0, description="how long no new error may appear")
    poll: Seconds = Field(default=10.0, le=600)
    metrics: list[str] = Field(default_factory=lambda: list(ERROR_METRICS), min_length=1)
    hint: str = Field(default="", max_length=500, description="added to a failure: what next")
    dcgm_names: dict[str, str] = Field(default_factory=dict)  # node -> its DCGM Hostname

    def names(self) -> list[str]:
        for metric in self.metrics:
            if not re.fullmatch(METRIC, metric):
                raise ActionError(f"{metric!r} is not a metric name")
        return [self.dcgm_names.get(n, n) for n in hostlist.expand(self.nodes)]


class ErrorsHoldAction(ActionBase[PrometheusBackend, PrometheusConfig]):
    """A soak: the nodes' XID and ECC counters must not rise for ``duration``."""

    name: ClassVar[str] = "prom.gpu_errors_hold"
    Arguments: ClassVar[type[StrictArguments]] = ErrorsHoldArguments

    def plan(self, args: ErrorsHoldArguments) -> list[str]:
        watch = ErrorWatch(self.backend, args.names(), args.metrics)
        return [f"for {format_duration(args.duration)}, every {format_duration(args.poll)}: "
                f"{watch.query()} must not rise above its value at the start (no new XID or "
                "ECC error); a node with no series fails"]

    def run(self, args: ErrorsHoldArguments, ctx: ActionContext) -> ActionResult:
        watch = ErrorWatch(self.backend, args.names(), args.metrics)
        try:
            reads = watch.hold(args.duration, args.poll, ctx, self._sleep)
        except ActionError as exc:
            if not args.hint:
                raise
            raise type(exc)(f"{exc}. {args.hint}") from exc
        return ActionResult(f"no new XID or ECC error on {args.nodes} for "
                            f"{format_duration(args.duration)}",
                            {"nodes": watch.nodes, "reads": reads,
                             "series": len(watch.baseline)}, changed=False)
