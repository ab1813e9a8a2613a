"""The ``prom.wait`` action: poll an instant query until every series satisfies ``expect``.

Checks (``promql`` + ``expect`` in a runbook) are evaluated by the bot itself; this
action is for steps that must *wait* for the cluster to settle, e.g. after a reboot
``prom.wait: {query: 'DCGM_FI_DEV_XID_ERRORS{hostname="gpu07"}', expect: "== 0",
timeout: 10m}``. It fails closed: a query that returns no series never satisfies it
("no data for <query>"), every series is judged on its own by its whole label set
(adapters.prometheus.verdict), and when the time is up the failure names each series
still off (the first ``SHOWN_VALUES``) with the value last seen.
A query Prometheus rejects fails at once; Prometheus not answering is retried until
the timeout and then reported with its reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, ClassVar

from pydantic import Field, field_validator

from adapters.actions import (
    Action,
    ActionContext,
    ActionError,
    ActionResult,
    ActionSet,
    ActionTimeout,
    StrictArguments,
)
from adapters.prometheus.backend import (
    PrometheusApiBackend,
    PrometheusBackend,
    PrometheusError,
    PrometheusRejected,
    Sample,
)
from adapters.prometheus.config import PrometheusConfig
from adapters.prometheus.promql import Expectation, format_seconds, parse_seconds
from adapters.prometheus.verdict import SHOWN, judge, listing

SHOWN_VALUES = SHOWN  # series listed in a failure message (all of them go to the details)


def _seconds(value: Any) -> Any:
    return parse_seconds(value) if isinstance(value, str | int | float) else value


class WaitArguments(StrictArguments):
    query: str = Field(min_length=1, max_length=10_000, description="a PromQL instant query")
    expect: str = Field(description='a comparison every series must satisfy: "== 0", "< 5"')
    timeout: float = Field(default=300.0, gt=0, le=86_400,
                           description="seconds (or like 10m) to wait at most")
    poll: float = Field(default=5.0, ge=0.1, le=3600, description="seconds between queries")

    _durations = field_validator("timeout", "poll", mode="before")(_seconds)

    @field_validator("expect")
    @classmethod
    def _expect(cls, value: str) -> str:
        Expectation.parse(value)
        return value


def _values(samples: list[Sample]) -> list[dict[str, Any]]:
    return [{"labels": s.labels, "value": s.value} for s in samples]


def _shown(samples: tuple[Sample, ...]) -> str:
    return listing(samples, SHOWN_VALUES)


class WaitAction:
    name: ClassVar[str] = "prom.wait"
    Arguments: ClassVar[type[StrictArguments]] = WaitArguments

    def __init__(self, backend: PrometheusBackend, config: PrometheusConfig,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.backend = backend
        self.config = config
        self._sleep = sleep

    def plan(self, args: WaitArguments) -> list[str]:
        return [f"wait until every series of {args.query} is {Expectation.parse(args.expect)}: "
                f"query {self.config.url} every {format_seconds(args.poll)}, at most "
                f"{format_seconds(args.timeout)} (no data does not count as done)"]

    def _interruptible(self, ctx: ActionContext) -> AbstractContextManager[None]:
        """A stop cuts the backend's retry pauses short (a request in flight runs out)."""
        if isinstance(self.backend, PrometheusApiBackend):
            return self.backend.interruptible(ctx.stopping)
        return nullcontext()

    def run(self, args: WaitArguments, ctx: ActionContext) -> ActionResult:
        expect = Expectation.parse(args.expect)
        began = time.monotonic()
        budget = min(args.timeout, ctx.remaining())
        polls = 0
        samples: list[Sample] | None = None
        error: str | None = None
        while True:
            polls += 1
            left = budget - (time.monotonic() - began)
            try:
                with self._interruptible(ctx):
                    samples, error = self.backend.query(args.query, timeout=max(0.1, left)), None
            except PrometheusRejected as exc:
                raise ActionError(f"{exc} (query: {args.query})") from exc
            except PrometheusError as exc:
                samples, error = None, str(exc)
            if samples and judge(samples, expect).passed:
                waited = time.monotonic() - began
                return ActionResult(
                    summary=(f"every series of {args.query} is {expect} ({len(samples)} "
                             f"series, after {format_seconds(waited)})"),
                    details={"query": args.query, "expect": str(expect),
                             "values": _values(samples), "waited": round(waited, 3),
                             "polls": polls},
                    changed=False)
            left = budget - (time.monotonic() - began)
            if left <= 0:
                break
            if samples is None:
                seen = str(error)
            elif not samples:
                seen = "no data"
            else:
                seen = _shown(judge(samples, expect).failing)
            ctx.progress(f"waiting for {args.query} {expect}: {seen}")
            ctx.checkpoint(f"waiting for {args.query} {expect}")
            self._sleep(ctx.pause(min(args.poll, left)))
        took = format_seconds(time.monotonic() - began)
        if samples is None:
            raise ActionTimeout(f"{error} (waited {took} for {args.query} {expect})")
        if not samples:
            raise ActionTimeout(f"no data for {args.query} (waited {took}, {polls} queries)")
        failing = judge(samples, expect).failing
        raise ActionTimeout(
            f"{args.query} not {expect} after {took}: {len(failing)} of {len(samples)} "
            f"series still off: {_shown(failing)}")


ACTION_CLASSES: tuple[type[WaitAction], ...] = (WaitAction,)


class PrometheusActions(ActionSet):
    """Every ``prom.*`` action over one backend: ``PrometheusActions(config).all()``."""

    action_classes = ACTION_CLASSES

    def __init__(self, config: PrometheusConfig, backend: PrometheusBackend | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.config = config
        self.backend = backend if backend is not None else PrometheusApiBackend(config)
        self._sleep = sleep



def prometheus_actions(config: PrometheusConfig) -> list[Action]:
    """The ``prom.*`` actions for a configuration."""
    return PrometheusActions(config).all()
