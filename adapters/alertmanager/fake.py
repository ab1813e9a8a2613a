"""``FakeAlertmanager``: an in-memory ``AlertmanagerBackend`` for tests, type-checked against
the Protocol.

It keeps alerts and silences as Alertmanager would; it never talks to one. Nothing outside
tests may use it.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Collection, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from adapters.alertmanager.backend import (
    Alert,
    Matcher,
    MatchersLike,
    Silence,
    matchers_from,
)

if TYPE_CHECKING:
    from adapters.alertmanager.backend import AlertmanagerBackend


class FakeAlertmanager:
    """Silences by ID (``s1``, ``s2``...) and the ``firing`` alerts. A silence is active from
    its creation until expired (time does not pass here).

    Alerts are shown as ``GET /api/v2/alerts`` shows them: an alert is silenced by every
    active silence whose matchers match its labels (and by the IDs its ``silenced_by``
    names), inhibited when its ``inhibited_by`` names an alert, and its ``state`` is then
    ``suppressed`` (else ``active``, or ``unprocessed`` as given). The filters work as
    Alertmanager's do: ``active=False`` leaves out active alerts, ``silenced=False``
    silenced ones and ``inhibited=False`` inhibited ones, each on its own (an alert both
    silenced and inhibited needs both); an alert that ended is never shown."""

    def __init__(self) -> None:
        self.silences: dict[str, Silence] = {}
        self.firing: list[Alert] = []
        self._ids = itertools.count(1)

    def alerts(self, filters: Mapping[str, str] | None = None, *, active: bool = True,
               silenced: bool = False, inhibited: bool = False) -> list[Alert]:
        now = datetime.now(UTC)
        found = []
        for alert in map(self._with_status, self.firing):
            if alert.ends_at is not None and alert.ends_at < now:
                continue
            if ((not active and alert.state == "active")
                    or (not silenced and alert.silenced_by)
                    or (not inhibited and alert.inhibited_by)):
                continue
            if all(alert.labels.get(k) == v for k, v in (filters or {}).items()):
                found.append(alert)
        return sorted(found, key=lambda a: a.fingerprint)

    def _with_status(self, alert: Alert) -> Alert:
        silenced_by = tuple(dict.fromkeys([*alert.silenced_by, *(
            s.id for s in self.silences.values()
            if s.state == "active" and all(_matches(m, alert.labels) for m in s.matchers))]))
        suppressed = bool(silenced_by or alert.inhibited_by)
        state = "suppressed" if suppressed else (
            "unprocessed" if alert.state == "unprocessed" else "active")
        return replace(alert, silenced_by=silenced_by, state=state)

    def create_silence(self, matchers: MatchersLike, starts: datetime | None, ends: datetime,
                       created_by: str, comment: str, *, regex: Collection[str] = (),
                       silence_id: str | None = None) -> str:
        silence_id = silence_id or f"s{next(self._ids)}"
        self.silences[silence_id] = Silence(
            silence_id, matchers_from(matchers, regex), starts or datetime.now(UTC), ends,
            created_by, comment, "active")
        return silence_id

    def find_silences(self, matchers: MatchersLike | None = None, *,
                      regex: Collection[str] = (), exact: bool = False,
                      created_by: str | None = None) -> list[Silence]:
        wanted = set(matchers_from(matchers or {}, regex))
        found = [s for s in self.silences.values() if s.state in ("active", "pending")
                 and (created_by is None or s.created_by == created_by)
                 and ((set(s.matchers) == wanted) if exact else wanted <= set(s.matchers))]
        return sorted(found, key=lambda s: s.ends_at, reverse=True)

    def get_silence(self, silence_id: str) -> Silence | None:
        return self.silences.get(silence_id)

    def expire_silence(self, silence_id: str) -> bool:
        silence = self.silences.get(silence_id)
        if silence is None or silence.state == "expired":
            return False
        self.silences[silence_id] = replace(silence, state="expired")
        return True

    def active(self) -> list[str]:
        """The matchers of each active silence, as text (``node=~"gpu03|gpu04"``)."""
        return [" ".join(str(m) for m in s.matchers) for s in self.silences.values()
                if s.state == "active"]


def _matches(matcher: Matcher, labels: Mapping[str, str]) -> bool:
    """As Alertmanager matches a silence: a missing label is the empty string, a regular
    expression must match the whole value."""
    value = labels.get(matcher.name, "")
    found = (re.fullmatch(matcher.value, value) is not None if matcher.is_regex
             else value == matcher.value)
    return found == matcher.is_equal


if TYPE_CHECKING:
    _checked: AlertmanagerBackend = FakeAlertmanager()
