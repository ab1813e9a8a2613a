"""Talking to Alertmanager: records (``Alert``, ``Silence``, ``Matcher``), the
``AlertmanagerBackend`` protocol and its implementation over the HTTP API v2.

Plain HTTP with the standard library, imported on first use: the API is four calls. Matcher
values are always escaped like PromQL strings (``promql.escape_label_value``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from adapters.actions import ActionError
from adapters.alertmanager.config import AlertmanagerConfig
from adapters.prometheus.promql import check_label_name, escape_label_value


class AlertmanagerError(ActionError):
    """Alertmanager refused a request or gave an unexpected answer.

    ``status`` is the HTTP status (0 when there was no answer)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class AlertmanagerUnavailable(AlertmanagerError):
    """Alertmanager did not answer (connection refused, timeout)."""


@dataclass(frozen=True)
class Matcher:
    """One silence matcher; ``is_equal=False`` negates it (``!=``, ``!~``)."""

    name: str
    value: str
    is_regex: bool = False
    is_equal: bool = True

    @property
    def op(self) -> str:
        return {(True, False): "=", (True, True): "=~", (False, False): "!=",
                (False, True): "!~"}[(self.is_equal, self.is_regex)]

    def __str__(self) -> str:
        return f'{self.name}{self.op}"{escape_label_value(self.value)}"'

    def as_api(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "isRegex": self.is_regex,
                "isEqual": self.is_equal}


MatchersLike = Mapping[str, str] | Iterable[Matcher]


def matchers_from(matchers: MatchersLike, regex: Collection[str] = (),
                  negative: Collection[str] = ()) -> tuple[Matcher, ...]:
    """Matchers from a ``{name: value}`` mapping (equality; the names in ``regex`` match
    their value as a regular expression, those in ``negative`` must not match) or from
    ``Matcher`` objects, sorted by name."""
    if isinstance(matchers, Mapping):
        unknown = (set(regex) | set(negative)) - set(matchers)
        if unknown:
            raise ValueError(f"regex or negative names {sorted(unknown)} that are not among "
                             "the matchers")
        if negative and set(negative) >= set(matchers):
            raise ValueError("at least one matcher must match (not only negative ones)")
        built = [Matcher(check_label_name(n), v, is_regex=n in regex, is_equal=n not in negative)
                 for n, v in matchers.items()]
    else:
        built = [Matcher(check_label_name(m.name), m.value, m.is_regex, m.is_equal)
                 for m in matchers]
    return tuple(sorted(built, key=lambda m: (m.name, m.value, m.is_regex, m.is_equal)))


@dataclass(frozen=True)
class Alert:
    """An alert as Alertmanager holds it. ``state``: active, suppressed or unprocessed."""

    labels: dict[str, str]
    annotations: dict[str, str]
    state: str
    starts_at: datetime
    fingerprint: str
    ends_at: datetime | None = None
    silenced_by: tuple[str, ...] = ()
    inhibited_by: tuple[str, ...] = ()
    generator_url: str = ""


@dataclass(frozen=True)
class Silence:
    """A silence; ``state``: active, pending or expired."""

    id: str
    matchers: tuple[Matcher, ...]
    starts_at: datetime
    ends_at: datetime
    created_by: str
    comment: str
    state: str
    updated_at: datetime | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def as_dict(self) -> dict[str, Any]:
        return {"silence_id": self.id, "matchers": [str(m) for m in self.matchers],
                "starts_at": format_time(self.starts_at), "ends_at": format_time(self.ends_at),
                "created_by": self.created_by, "comment": self.comment, "state": self.state}


_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$")


def parse_time(text: str) -> datetime:
    """An RFC 3339 time as Alertmanager writes it (nanoseconds allowed), timezone-aware."""
    match = _TIME.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not an RFC 3339 time")
    whole, fraction, zone = match.groups()
    fraction = f".{(fraction or '0')[:6]:0<6}"
    return datetime.fromisoformat(whole + fraction + ("+00:00" if zone == "Z" else zone))


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC with milliseconds: ``2024-05-01T12:00:00.000Z``."""
    if moment.tzinfo is None:
        raise ValueError("times sent to Alertmanager must be timezone-aware")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class AlertmanagerBackend(Protocol):
    def alerts(self, filters: Mapping[str, str] | None = None, *, active: bool = True,
               silenced: bool = False, inhibited: bool = False) -> list[Alert]:
        """Alerts whose labels equal every filter; which states to include."""
        ...

    def create_silence(self, matchers: MatchersLike, starts: datetime | None, ends: datetime,
                       created_by: str, comment: str, *, regex: Collection[str] = (),
                       silence_id: str | None = None) -> str:
        """Create (or, with ``silence_id``, update) a silence; returns its ID."""
        ...

    def find_silences(self, matchers: MatchersLike | None = None, *,
                      regex: Collection[str] = (), exact: bool = False,
                      created_by: str | None = None) -> list[Silence]:
        """Active and pending silences having every given matcher (``exact``: only those)."""
        ...

    def get_silence(self, silence_id: str) -> Silence | None: ...

    def expire_silence(self, silence_id: str) -> bool:
        """Expire a silence; False when it was already expired or does not exist."""
        ...


def _message(raw: str) -> str:
    try:
        body = json.loads(raw)
    except ValueError:
        return " ".join(raw.split())[:300]
    if isinstance(body, dict):
        return str(body.get("message") or body.get("error") or body)[:300]
    return str(body)[:300]


class HttpAlertmanagerBackend:
    """``AlertmanagerBackend`` over Alertmanager's HTTP API v2."""

    def __init__(self, config: AlertmanagerConfig) -> None:
        self.config = config

    def _request(self, method: str, path: str, params: list[tuple[str, str]] | None = None,
                 body: Any = None) -> Any:
        import urllib.error
        import urllib.parse
        import urllib.request

        url = f"{self.config.url}/api/v2{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json", **(self.config.headers or {})}
        if data is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.config.timeout) as response:
                raw = response.read().decode()
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            raise AlertmanagerError(
                f"Alertmanager at {self.config.url} refused {method} /api/v2{path}: "
                f"HTTP {exc.code}: {_message(text) or exc.reason}", exc.code) from exc
        except urllib.error.URLError as exc:
            reason = exc.reason
            problem = ("connection refused" if isinstance(reason, ConnectionRefusedError)
                       else f"no answer within {self.config.timeout:g}s"
                       if isinstance(reason, TimeoutError) else str(reason))
            raise AlertmanagerUnavailable(
                f"Alertmanager at {self.config.url} is not answering ({problem})") from exc
        except TimeoutError as exc:
            raise AlertmanagerUnavailable(
                f"Alertmanager at {self.config.url} is not answering (no answer within "
                f"{self.config.timeout:g}s)") from exc
        except OSError as exc:
            raise AlertmanagerUnavailable(
                f"Alertmanager at {self.config.url} is not answering ({exc})") from exc
        try:
            return json.loads(raw) if raw.strip() else None
        except ValueError as exc:
            raise AlertmanagerError(
                f"{self.config.url} answered, but not like Alertmanager's API v2 "
                f"({raw[:100]!r}); check alertmanager.url") from exc

    # --- alerts ---------------------------------------------------------------------

    def alerts(self, filters: Mapping[str, str] | None = None, *, active: bool = True,
               silenced: bool = False, inhibited: bool = False) -> list[Alert]:
        params = [("active", str(active).lower()), ("silenced", str(silenced).lower()),
                  ("inhibited", str(inhibited).lower())]
        params += [("filter", str(m)) for m in matchers_from(filters or {})]
        answer = self._request("GET", "/alerts", params)
        try:
            return [_alert(item) for item in answer or []]
        except (KeyError, TypeError, ValueError) as exc:
            raise AlertmanagerError(f"unexpected alert from Alertmanager: {exc!r}") from exc

    # --- silences -------------------------------------------------------------------

    def create_silence(self, matchers: MatchersLike, starts: datetime | None, ends: datetime,
                       created_by: str, comment: str, *, regex: Collection[str] = (),
                       silence_id: str | None = None) -> str:
        wanted = matchers_from(matchers, regex)
        if not wanted:
            raise AlertmanagerError("a silence needs at least one matcher")
        body: dict[str, Any] = {
            "matchers": [m.as_api() for m in wanted],
            "startsAt": format_time(starts or datetime.now(UTC)),
            "endsAt": format_time(ends), "createdBy": created_by, "comment": comment}
        if silence_id:
            body["id"] = silence_id
        answer = self._request("POST", "/silences", body=body)
        if not isinstance(answer, dict) or not answer.get("silenceID"):
            raise AlertmanagerError(f"Alertmanager created no silence: {answer!r}")
        return str(answer["silenceID"])

    def _silences(self) -> list[Silence]:
        answer = self._request("GET", "/silences")
        try:
            return [_silence(item) for item in answer or []]
        except (KeyError, TypeError, ValueError) as exc:
            raise AlertmanagerError(f"unexpected silence from Alertmanager: {exc!r}") from exc

    def find_silences(self, matchers: MatchersLike | None = None, *,
                      regex: Collection[str] = (), exact: bool = False,
                      created_by: str | None = None) -> list[Silence]:
        wanted = set(matchers_from(matchers or {}, regex))
        found = []
        for silence in self._silences():  # filtered here: the API's filter is not "exactly"
            if silence.state not in ("active", "pending"):
                continue
            if created_by is not None and silence.created_by != created_by:
                continue
            have = set(silence.matchers)
            if (have == wanted) if exact else wanted <= have:
                found.append(silence)
        return sorted(found, key=lambda s: s.ends_at, reverse=True)

    def get_silence(self, silence_id: str) -> Silence | None:
        try:
            answer = self._request("GET", f"/silence/{_silence_id(silence_id)}")
        except AlertmanagerError as exc:
            if exc.status == 404:
                return None
            raise
        return _silence(answer)

    def expire_silence(self, silence_id: str) -> bool:
        silence = self.get_silence(silence_id)
        if silence is None or silence.state == "expired":
            return False
        try:
            self._request("DELETE", f"/silence/{_silence_id(silence_id)}")
        except AlertmanagerError as exc:  # expired meanwhile: Alertmanager answers 500
            again = self.get_silence(silence_id) if exc.status else None
            if again is None or again.state != "expired":
                raise
            return False
        return True


_ID = re.compile(r"^[A-Za-z0-9-]{1,64}$")


def _silence_id(value: str) -> str:
    if not _ID.match(value):
        raise AlertmanagerError(f"{value!r} is not a silence ID (a UUID)")
    return value


def _alert(item: dict[str, Any]) -> Alert:
    status = item.get("status") or {}
    ends = item.get("endsAt")
    return Alert(
        labels=dict(item.get("labels") or {}), annotations=dict(item.get("annotations") or {}),
        state=str(status.get("state", "")), starts_at=parse_time(item["startsAt"]),
        fingerprint=str(item.get("fingerprint", "")),
        ends_at=parse_time(ends) if ends else None,
        silenced_by=tuple(status.get("silencedBy") or ()),
        inhibited_by=tuple(status.get("inhibitedBy") or ()),
        generator_url=str(item.get("generatorURL") or ""))


def _silence(item: dict[str, Any]) -> Silence:
    matchers = tuple(sorted(
        (Matcher(str(m["name"]), str(m["value"]), bool(m.get("isRegex", False)),
                 bool(m.get("isEqual", True))) for m in item.get("matchers") or []),
        key=lambda m: (m.name, m.value, m.is_regex, m.is_equal)))
    updated = item.get("updatedAt")
    return Silence(
        id=str(item["id"]), matchers=matchers, starts_at=parse_time(item["startsAt"]),
        ends_at=parse_time(item["endsAt"]), created_by=str(item.get("createdBy", "")),
        comment=str(item.get("comment", "")), state=str((item.get("status") or {}).get("state")),
        updated_at=parse_time(updated) if updated else None)
