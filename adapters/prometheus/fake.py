"""``FakePrometheus``: a ``PrometheusBackend`` for tests that answers every query with the
same samples (or raises the same error), type-checked against the Protocol.

It never talks to a Prometheus. Nothing outside tests may use it.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import TYPE_CHECKING, Any

from adapters.prometheus.backend import PrometheusError, Sample, Series
from kit.durations import parse_duration

if TYPE_CHECKING:
    from adapters.prometheus.backend import PrometheusBackend


def _unix(value: datetime | float) -> float:
    return value.timestamp() if isinstance(value, datetime) else float(value)


class FakePrometheus:
    """Answers every instant query with ``answer`` (or raises it); a range query gets each
    series of ``answer`` holding its value at every step. ``queries`` records the PromQL.
    With ``gpus``, the GPU gate's presence query (DCGM_FI_DEV_GPU_TEMP of some hosts) gets
    that many GPUs for each host it names, as dcgm-exporter reports them, and (``answer``
    empty) its error watch gets each of those GPUs with no error."""

    def __init__(self, answer: list[Sample] | Exception, gpus: int | None = None) -> None:
        self.answer = answer
        self.gpus = gpus
        self.gpus_of: dict[str, int] = {}  # a host with another count (a GPU off the bus)
        self.queries: list[str] = []

    def _samples(self, promql: str) -> list[Sample]:
        self.queries.append(promql)
        if isinstance(self.answer, Exception):
            raise self.answer
        if self.gpus is not None and promql.startswith("DCGM_FI_DEV_GPU_TEMP"):
            hosts = dict.fromkeys(re.findall(r'Hostname="([^"]+)"', promql))
            return [Sample({"Hostname": h, "gpu": str(g)}, 40.0)
                    for h in hosts for g in range(self.gpus_of.get(h, self.gpus))]
        errors = re.search(r'__name__=~"[^"]*", Hostname=~"([^"]+)"', promql)
        if self.gpus is not None and errors and not self.answer:  # no error on any GPU
            hosts = dict.fromkeys(errors.group(1).replace("\\", "").split("|"))  # unescaped
            return [Sample({"__name__": "DCGM_FI_DEV_XID_ERRORS", "Hostname": h, "gpu": str(g)},
                           0.0) for h in hosts for g in range(self.gpus)]
        return list(self.answer)

    def query(self, promql: str, at: datetime | float | None = None, *,
              timeout: float | None = None) -> list[Sample]:
        return self._samples(promql)

    def query_range(self, promql: str, start: datetime | float, end: datetime | float,
                    step: float | str, *, timeout: float | None = None) -> list[Series]:
        first, last, every = _unix(start), _unix(end), parse_duration(step)
        if every <= 0:
            raise PrometheusError("the step of a range query must be positive")
        times = [first + i * every for i in range(int((last - first) // every) + 1)]
        return [Series(s.labels, [(t, s.value) for t in times]) for s in self._samples(promql)]

    def ready(self, *, timeout: float | None = None) -> bool:
        return not isinstance(self.answer, Exception)

    def alerts(self, *, timeout: float | None = None) -> list[dict[str, Any]]:
        if isinstance(self.answer, Exception):
            raise self.answer
        return []


if TYPE_CHECKING:
    _checked: PrometheusBackend = FakePrometheus([])
