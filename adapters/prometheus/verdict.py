"""Judging the series of an instant query against an ``expect``, each on its own.

Series are never grouped by a few labels, so a failing series cannot hide behind a passing
one that shares its host or GPU; no series at all is not a pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from adapters.prometheus.backend import Sample
from adapters.prometheus.promql import Expectation

SHOWN = 10  # series named in a message; "and N more" for the rest


@dataclass(frozen=True)
class Verdict:
    expect: Expectation
    samples: tuple[Sample, ...]
    failing: tuple[Sample, ...]

    @property
    def passed(self) -> bool:
        return bool(self.samples) and not self.failing

    def failure(self) -> str:
        """``2 of 64 series not == 0: <series> 79, <series> 48``."""
        return (f"{len(self.failing)} of {len(self.samples)} series not {self.expect}: "
                f"{listing(self.failing)}")


def judge(samples: Iterable[Sample], expect: Expectation) -> Verdict:
    """Every series judged by itself, in the order Prometheus returned it, and named by its
    whole label set (``__name__`` included):

        verdict = judge(backend.query(query), Expectation.parse("== 0"))
        verdict.passed           # some data, and every series satisfies expect
        verdict.failing          # the series that do not, in order
        listing(verdict.failing) # 'X{gpu="3", instance="a:9400"} 79, ... and 4 more'
    """
    every = tuple(samples)
    return Verdict(expect, every, tuple(s for s in every if not expect(s.value)))


def listing(samples: Sequence[Sample], limit: int = SHOWN) -> str:
    """The first ``limit`` series with their values, then ``and N more``."""
    listed = ", ".join(s.describe() for s in samples[:limit])
    more = len(samples) - limit
    return listed + (f" and {more} more" if more > 0 else "")
