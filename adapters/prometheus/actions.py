"""The ``prom.*`` actions: ``prom.wait`` here, ``prom.gpu_errors_hold`` (soak.py) and
``prom.gpu_identity`` (identity.py). ``prom.wait`` polls an instant query until every series
satisfies ``expect``.

It fails closed: no series never satisfies it, and every series is judged on its own.
Checks (``promql`` + ``expect``) are the bot's; this action is for steps that must wait.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from typing import Any, ClassVar

from pydantic import Field, field_validator

from adapters.actions import (
    ActionBase,
    ActionContext,
    ActionError,
    ActionResult,
    ActionTimeout,
    ConnectingActionSet,
    Seconds,
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
from adapters.prometheus.identity import GpuIdentityAction
from adapters.prometheus.promql import Expectation
from adapters.prometheus.soak import ErrorsHoldAction
from adapters.prometheus.template import QUERY
from adapters.prometheus.verdict import judge, listing
from kit.durations import format_duration


class WaitArguments(StrictArguments):
    query: str = Field(min_length=1, max_length=10_000, description="a PromQL instant query",
                       json_schema_extra=QUERY)  # rendered by the rule of template.py
    expect: str = Field(description='a comparison every series must satisfy: "== 0", "< 5"')
    timeout: Seconds = Field(default=300.0, le=86_400,
                             description="seconds (or like 10m) to wait at most")
    poll: Seconds = Field(default=5.0, ge=0.1, le=3600, description="seconds between queries")

    @field_validator("expect")
    @classmethod
    def _expect(cls, value: str) -> str:
        Expectation.parse(value)
        return value


def _values(samples: list[Sample]) -> list[dict[str, Any]]:
    return [{"labels": s.labels, "value": s.value} for s in samples]


class WaitAction(ActionBase[PrometheusBackend, PrometheusConfig]):
    """Wait for the cluster to settle, e.g. after a reboot ``prom.wait: {query:
    'DCGM_FI_DEV_XID_ERRORS{hostname="gpu07"}', expect: "== 0", timeout: 10m}``.

    A query that returns no series fails as "no data for <query>"; when the time is up the
    failure names each series still off (the first ``verdict.SHOWN``) with the value last
    seen. A query Prometheus rejects fails at once; Prometheus not answering is retried
    until the timeout and then reported with its reason.
    """

    name: ClassVar[str] = "prom.wait"
    Arguments: ClassVar[type[StrictArguments]] = WaitArguments

    def plan(self, args: WaitArguments) -> list[str]:
        return [f"wait until every series of {args.query} is {Expectation.parse(args.expect)}: "
                f"query {self.config.url} every {format_duration(args.poll)}, at most "
                f"{format_duration(args.timeout)} (no data does not count as done)"]

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
                             f"series, after {format_duration(waited)})"),
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
                seen = listing(judge(samples, expect).failing)
            ctx.progress(f"waiting for {args.query} {expect}: {seen}")
            ctx.checkpoint(f"waiting for {args.query} {expect}")
            self._sleep(ctx.pause(min(args.poll, left)))
        took = format_duration(time.monotonic() - began)
        if samples is None:
            raise ActionTimeout(f"{error} (waited {took} for {args.query} {expect})")
        if not samples:
            raise ActionTimeout(f"no data for {args.query} (waited {took}, {polls} queries)")
        failing = judge(samples, expect).failing
        raise ActionTimeout(
            f"{args.query} not {expect} after {took}: {len(failing)} of {len(samples)} "
            f"series still off: {listing(failing)}")


ACTION_CLASSES: tuple[type[ActionBase[PrometheusBackend, PrometheusConfig]], ...] = (
    WaitAction, ErrorsHoldAction, GpuIdentityAction)


class PrometheusActions(ConnectingActionSet[PrometheusBackend, PrometheusConfig]):
    """Every ``prom.*`` action over one backend: ``PrometheusActions(config).all()``."""

    action_classes = ACTION_CLASSES
    backend_class = PrometheusApiBackend
