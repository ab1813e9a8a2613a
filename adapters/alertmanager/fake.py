"""``FakeAlertmanager``: an in-memory ``AlertmanagerBackend`` for tests, type-checked against
the Protocol.

It keeps alerts and silences as Alertmanager would; it never talks to one. Nothing outside
tests may use it.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from adapters.alertmanager.backend import Alert, MatchersLike, Silence, matchers_from

if TYPE_CHECKING:
    from adapters.alertmanager.backend import AlertmanagerBackend


class FakeAlertmanager:
    """Silences by ID (``s1``, ``s2``...) and the ``firing`` alerts. A silence is active from
    its creation until expired (time does not pass here); an alert with ``silenced_by`` or
    ``inhibited_by`` counts as silenced or inhibited."""

    def __init__(self) -> None:
        self.silences: dict[str, Silence] = {}
        self.firing: list[Alert] = []
        self._ids = itertools.count(1)

    def alerts(self, filters: Mapping[str, str] | None = None, *, active: bool = True,
               silenced: bool = False, inhibited: bool = False) -> list[Alert]:
        def shown(alert: Alert) -> bool:
            if alert.silenced_by:
                return silenced
            if alert.inhibited_by:
                return inhibited
            return active

        return [a for a in self.firing if shown(a)
                and all(a.labels.get(k) == v for k, v in (filters or {}).items())]

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


if TYPE_CHECKING:
    _checked: AlertmanagerBackend = FakeAlertmanager()
