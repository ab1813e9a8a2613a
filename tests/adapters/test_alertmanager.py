"""Tests of the Alertmanager adapter (adapters.alertmanager).

Fast tests (no daemon): configuration, matchers, times, the actions' arguments and plans.

``lab`` tests run a real Alertmanager from Debian's package (gossip off), started by this
module (see tests.adapters.monitoring). Alerts are POSTed straight to ``/api/v2/alerts``
(the fast path; the Prometheus-to-Alertmanager trip is the lab's business). Each test
labels its alerts and silences with its own ``run`` value, so tests do not see each
other's. Covered: listing alerts by label (values with quotes and backslashes too), a
silence suppressing an alert until it is expired, regex matchers, the silence action
reusing its own silence (and extending a short one, and not reusing a person's), the
expire action by matchers and by ID (none: a no-op), and Alertmanager not answering.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from adapters.actions import ActionContext, ActionError
from adapters.alertmanager.actions import (
    BOT_AUTHOR,
    AlertmanagerActions,
    ExpireSilenceArguments,
    SilenceArguments,
)
from adapters.alertmanager.backend import (
    Alert,
    AlertmanagerBackend,
    AlertmanagerUnavailable,
    HttpAlertmanagerBackend,
    Matcher,
    format_time,
    matchers_from,
    parse_time,
)
from adapters.alertmanager.config import AlertmanagerConfig
from adapters.alertmanager.fake import FakeAlertmanager
from tests.adapters.monitoring import Monitoring, binaries, free_port, http_json, start_alertmanager

WEIRD = 'we"ird\\host'


def ctx(seconds: float = 60) -> ActionContext:
    return ActionContext(execution_id=1, step_id="test", deadline=time.monotonic() + seconds)


# --- fast tests ---------------------------------------------------------------------

def test_config() -> None:
    config = AlertmanagerConfig(url="http://alertmanager:9093/")
    assert (config.url, config.timeout, config.headers) == ("http://alertmanager:9093", 10, None)
    with pytest.raises(ValidationError, match="not a URL"):
        AlertmanagerConfig(url="alertmanager:9093")


def test_matchers_and_times() -> None:
    built = matchers_from({"node": "gpu0[1-3]", "alertname": "GpuXid"}, regex=["node"])
    assert [str(m) for m in built] == ['alertname="GpuXid"', 'node=~"gpu0[1-3]"']
    assert str(Matcher("node", WEIRD)) == 'node="we\\"ird\\\\host"'
    assert str(Matcher("node", "x", is_equal=False, is_regex=True)) == 'node!~"x"'
    with pytest.raises(ValueError, match="not among the matchers"):
        matchers_from({"node": "x"}, regex=["host"])
    moment = parse_time("2024-05-01T12:00:00.123456789Z")
    assert moment == datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)
    assert parse_time("2024-05-01T14:00:00+02:00") == datetime(2024, 5, 1, 12, tzinfo=UTC)
    assert format_time(moment) == "2024-05-01T12:00:00.123Z"


def test_action_arguments_and_plans() -> None:
    args = SilenceArguments(matchers={"node": "gpu07", "alertname": "GpuXid"}, duration="2h",
                            comment="swap GPU 3")
    assert (args.duration, args.created_by) == (7200, BOT_AUTHOR)
    for bad, error in (({"matchers": {}}, "at least 1"),
                       ({"matchers": {"node": ""}}, "non-empty value"),
                       ({"matchers": {"no-de": "x"}}, "not a label name"),
                       ({"matchers": {"node": "x"}, "regex": ["host"]}, "not among"),
                       ({"matchers": {"node": "x"}, "duration": "forever"}, "not a duration"),
                       ({"matchers": {"node": "x"}, "duration": "90d"}, "less than or equal")):
        with pytest.raises(ValidationError, match=error):
            SilenceArguments(**{"duration": "1h", "comment": "c", **bad})
    with pytest.raises(ValidationError, match="either silence_id or matchers"):
        ExpireSilenceArguments()
    with pytest.raises(ValidationError, match="either silence_id or matchers"):
        ExpireSilenceArguments(silence_id="abc", matchers={"node": "x"})
    actions = AlertmanagerActions(AlertmanagerConfig(url="http://am:9093")).by_name()
    assert actions["alertmanager.silence"].plan(args) == [
        "amtool --alertmanager.url=http://am:9093 silence add --author=gpu-runbook-bot "
        "--duration=2h '--comment=swap GPU 3' 'alertname=\"GpuXid\"' 'node=\"gpu07\"'"
        "  # unless an active silence by gpu-runbook-bot with exactly these matchers already "
        "lasts that long"]
    expire = actions["alertmanager.expire_silence"]
    assert expire.plan(ExpireSilenceArguments(silence_id="1234-abcd")) == [
        "amtool --alertmanager.url=http://am:9093 silence expire 1234-abcd"]
    assert expire.plan(ExpireSilenceArguments(matchers={"node": "gpu07"})) == [
        "amtool --alertmanager.url=http://am:9093 silence query --quiet 'node=\"gpu07\"'"
        "  # then expire each active or pending silence with exactly these matchers "
        "(amtool silence expire ID)"]


def silenced_alerts_as_alertmanager_shows_them(
        alertmanager: AlertmanagerBackend, post: Callable[[dict[str, str]], None],
        run: str) -> None:
    """What ``GET /api/v2/alerts`` answers about a silenced alert, for each filter: run
    against the fake here and against a real Alertmanager below, so the fake stays true."""
    post({"alertname": "GpuXid", "node": "gpu03", "run": run})
    post({"alertname": "GpuXid", "node": "gpu05", "run": run})
    silence_id = alertmanager.create_silence({"node": "gpu0[1-3]", "run": run}, None,
                                             datetime.now(UTC) + timedelta(minutes=10),
                                             "alice", "maintenance", regex=["node"])

    def nodes(**flags: bool) -> list[str]:
        return sorted(a.labels["node"] for a in alertmanager.alerts({"run": run}, **flags))

    assert nodes() == ["gpu05"]  # the defaults: not silenced, not inhibited
    assert nodes(silenced=True, inhibited=True) == ["gpu03", "gpu05"]  # an alerts check's
    assert nodes(silenced=True, active=False) == ["gpu03"]
    assert nodes(active=False) == []
    (gpu03,) = [a for a in alertmanager.alerts({"run": run}, silenced=True)
                if a.labels["node"] == "gpu03"]
    assert (gpu03.state, gpu03.silenced_by, gpu03.inhibited_by) == (
        "suppressed", (silence_id,), ())
    assert alertmanager.expire_silence(silence_id) is True
    assert nodes() == ["gpu03", "gpu05"]


def test_the_fake_shows_silenced_alerts_as_alertmanager_does() -> None:
    fake = FakeAlertmanager()

    def post(labels: dict[str, str]) -> None:
        fake.firing.append(Alert(labels, {}, "active", datetime.now(UTC) - timedelta(minutes=1),
                                 fingerprint=",".join(sorted(labels.values()))))

    silenced_alerts_as_alertmanager_shows_them(fake, post, "r1")


def test_the_fake_filters_as_alertmanager_does() -> None:
    """Alertmanager's filter (api/v2 alertFilter): ``active=false`` leaves out active alerts,
    ``silenced=false`` silenced ones and ``inhibited=false`` inhibited ones, each on its own;
    an alert that ended is never shown."""
    now = datetime.now(UTC)
    fake = FakeAlertmanager()
    fake.firing += [
        Alert({"alertname": "A"}, {}, "active", now, "1", inhibited_by=("9",)),
        Alert({"alertname": "B"}, {}, "active", now, "2", silenced_by=("s7",),
              inhibited_by=("9",)),
        Alert({"alertname": "C"}, {}, "active", now, "3", ends_at=now - timedelta(seconds=1)),
        Alert({"alertname": "D"}, {}, "unprocessed", now, "4"),
    ]

    def names(**flags: bool) -> list[str]:
        return [a.labels["alertname"] for a in fake.alerts(None, **flags)]

    assert names() == ["D"]
    assert names(inhibited=True) == ["A", "D"]
    assert names(silenced=True) == ["D"]  # B is inhibited too
    assert names(silenced=True, inhibited=True) == ["A", "B", "D"]
    assert names(silenced=True, inhibited=True, active=False) == ["A", "B", "D"]
    assert [a.state for a in fake.alerts(silenced=True, inhibited=True)] == [
        "suppressed", "suppressed", "unprocessed"]
    fake.create_silence({"alertname": "D"}, None, now + timedelta(hours=1), "alice", "x")
    fake.create_silence({"alertname": "A", "team": ""}, None, now + timedelta(hours=1), "bob",
                        "a missing label matches the empty value")
    assert [(a.labels["alertname"], a.silenced_by) for a in fake.alerts(silenced=True,
                                                                        inhibited=True)] == [
        ("A", ("s2",)), ("B", ("s7",)), ("D", ("s1",))]
    assert names(silenced=True, inhibited=True, active=False) == ["A", "B", "D"]


# --- against a real Alertmanager ------------------------------------------------------

@pytest.fixture(scope="module")
def monitoring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Monitoring]:
    _, alertmanager = binaries()
    handle = Monitoring(dir=tmp_path_factory.mktemp("alertmanager"))
    daemon, handle.alertmanager_url = start_alertmanager(handle.dir, alertmanager)
    handle.daemons.append(daemon)
    yield handle
    handle.stop()


@pytest.fixture
def backend(monitoring: Monitoring) -> HttpAlertmanagerBackend:
    return HttpAlertmanagerBackend(AlertmanagerConfig(url=monitoring.alertmanager_url,
                                                      timeout=5))


@pytest.fixture
def run() -> str:
    return uuid.uuid4().hex[:12]


def post_alert(monitoring: Monitoring, labels: dict[str, str], **annotations: str) -> None:
    http_json(f"{monitoring.alertmanager_url}/api/v2/alerts", [{
        "labels": labels, "annotations": annotations,
        "startsAt": format_time(datetime.now(UTC) - timedelta(minutes=1)),
        "endsAt": format_time(datetime.now(UTC) + timedelta(hours=1))}])


def actions(monitoring: Monitoring) -> dict[str, Any]:
    config = AlertmanagerConfig(url=monitoring.alertmanager_url, timeout=5)
    return AlertmanagerActions(config).by_name()


@pytest.mark.lab
def test_alerts_are_found_by_label(monitoring: Monitoring, backend: HttpAlertmanagerBackend,
                                   run: str) -> None:
    post_alert(monitoring, {"alertname": "GpuXid", "node": "gpu07", "xid": "79", "run": run},
               summary="XID 79 on gpu07")
    post_alert(monitoring, {"alertname": "GpuXid", "node": WEIRD, "xid": "48", "run": run})
    (alert,) = backend.alerts({"run": run, "node": "gpu07"})
    assert alert.labels == {"alertname": "GpuXid", "node": "gpu07", "xid": "79", "run": run}
    assert alert.annotations == {"summary": "XID 79 on gpu07"}
    assert alert.state == "active"
    assert alert.fingerprint and alert.starts_at.tzinfo is not None
    assert alert.starts_at < datetime.now(UTC)
    (odd,) = backend.alerts({"run": run, "node": WEIRD})
    assert (odd.labels["node"], odd.labels["xid"]) == (WEIRD, "48")
    assert len(backend.alerts({"run": run})) == 2
    assert backend.alerts({"run": run, "node": "gpu08"}) == []


@pytest.mark.lab
def test_a_silence_suppresses_an_alert_until_expired(
        monitoring: Monitoring, backend: HttpAlertmanagerBackend, run: str) -> None:
    post_alert(monitoring, {"alertname": "GpuXid", "node": "gpu03", "run": run})
    post_alert(monitoring, {"alertname": "GpuXid", "node": "gpu05", "run": run})
    silence_id = backend.create_silence({"node": "gpu0[1-3]", "run": run}, None,
                                        datetime.now(UTC) + timedelta(minutes=10), "alice",
                                        "maintenance", regex=["node"])
    (silenced,) = backend.alerts({"run": run}, silenced=True, active=False)
    assert (silenced.labels["node"], silenced.state, silenced.silenced_by) == \
        ("gpu03", "suppressed", (silence_id,))
    assert [a.labels["node"] for a in backend.alerts({"run": run})] == ["gpu05"]
    (found,) = backend.find_silences({"run": run})
    assert (found.id, found.state, found.created_by, found.comment) == \
        (silence_id, "active", "alice", "maintenance")
    assert [str(m) for m in found.matchers] == ['node=~"gpu0[1-3]"', f'run="{run}"']
    assert backend.expire_silence(silence_id) is True
    assert sorted(a.labels["node"] for a in backend.alerts({"run": run})) == ["gpu03", "gpu05"]
    assert backend.find_silences({"run": run}) == []
    assert backend.expire_silence(silence_id) is False  # already expired
    silence = backend.get_silence(silence_id)
    assert silence is not None and silence.state == "expired"


@pytest.mark.lab
def test_alertmanager_shows_silenced_alerts_as_the_fake_does(
        monitoring: Monitoring, backend: HttpAlertmanagerBackend, run: str) -> None:
    silenced_alerts_as_alertmanager_shows_them(
        backend, lambda labels: post_alert(monitoring, labels), run)


@pytest.mark.lab
def test_silence_action_reuses_its_own_silence(monitoring: Monitoring,
                                                backend: HttpAlertmanagerBackend,
                                                run: str) -> None:
    silence = actions(monitoring)["alertmanager.silence"]
    args = SilenceArguments(matchers={"node": "gpu07", "run": run}, duration="1h",
                            comment="drain gpu07")
    first = silence.run(args, ctx())
    assert first.changed is True
    assert first.summary.startswith(f"created silence {first.details['silence_id']} for ")
    second = silence.run(args, ctx())
    assert second.changed is False
    assert second.details["silence_id"] == first.details["silence_id"]
    assert "reused" in second.summary
    # A shorter request is covered too; a longer one extends the silence.
    shorter = silence.run(args.model_copy(update={"duration": 600.0}), ctx())
    assert (shorter.changed, shorter.details["silence_id"]) == \
        (False, first.details["silence_id"])
    longer = silence.run(args.model_copy(update={"duration": 7200.0}), ctx())
    assert (longer.changed, longer.details["silence_id"]) == (True, first.details["silence_id"])
    assert longer.summary.startswith("extended silence ")
    (only,) = backend.find_silences({"run": run, "node": "gpu07"}, exact=True)
    assert only.id == longer.details["silence_id"]
    assert only.ends_at > datetime.now(UTC) + timedelta(minutes=119)


@pytest.mark.lab
def test_silence_action_does_not_reuse_a_person_s_silence(
        monitoring: Monitoring, backend: HttpAlertmanagerBackend, run: str) -> None:
    theirs = backend.create_silence({"node": "gpu07", "run": run}, None,
                                    datetime.now(UTC) + timedelta(hours=5), "alice", "mine")
    broader = backend.create_silence({"run": run}, None,
                                     datetime.now(UTC) + timedelta(hours=5), BOT_AUTHOR, "x")
    result = actions(monitoring)["alertmanager.silence"].run(
        SilenceArguments(matchers={"node": "gpu07", "run": run}, duration=3600, comment="c"),
        ctx())
    assert result.changed is True
    assert result.details["silence_id"] not in (theirs, broader)
    assert len(backend.find_silences({"run": run})) == 3
    assert len(backend.find_silences({"run": run, "node": "gpu07"}, exact=True)) == 2


@pytest.mark.lab
def test_expire_silence_action(monitoring: Monitoring, backend: HttpAlertmanagerBackend,
                               run: str) -> None:
    by_name = actions(monitoring)
    expire = by_name["alertmanager.expire_silence"]
    none = expire.run(ExpireSilenceArguments(matchers={"run": run}), ctx())
    assert (none.changed, none.details) == (False, {"expired": []})
    assert "nothing to expire" in none.summary
    created = by_name["alertmanager.silence"].run(
        SilenceArguments(matchers={"run": run}, duration="30m", comment="c"), ctx())
    silence_id = created.details["silence_id"]
    kept = backend.create_silence({"run": run, "node": "gpu01"}, None,
                                  datetime.now(UTC) + timedelta(hours=1), BOT_AUTHOR, "other")
    done = expire.run(ExpireSilenceArguments(matchers={"run": run}), ctx())
    assert (done.changed, done.details["expired"]) == (True, [silence_id])
    again = expire.run(ExpireSilenceArguments(matchers={"run": run}), ctx())
    assert again.changed is False
    assert [s.id for s in backend.find_silences({"run": run})] == [kept]
    by_id = expire.run(ExpireSilenceArguments(silence_id=kept), ctx())
    assert (by_id.changed, by_id.summary) == (True, f"expired silence {kept}")
    repeat = expire.run(ExpireSilenceArguments(silence_id=kept), ctx())
    assert repeat.changed is False and "nothing to expire" in repeat.summary
    unknown = expire.run(ExpireSilenceArguments(silence_id=str(uuid.uuid4())), ctx())
    assert unknown.changed is False


def test_alertmanager_not_answering() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    backend = HttpAlertmanagerBackend(AlertmanagerConfig(url=url, timeout=1))
    with pytest.raises(AlertmanagerUnavailable,
                       match=rf"^Alertmanager at {url} is not answering \(connection refused\)$"):
        backend.alerts()
    action = AlertmanagerActions(AlertmanagerConfig(url=url)).by_name()["alertmanager.silence"]
    with pytest.raises(ActionError, match="silencing node=\"gpu07\" failed: Alertmanager at"):
        action.run(SilenceArguments(matchers={"node": "gpu07"}, duration=60, comment="c"), ctx())


@pytest.mark.lab
def test_alertmanager_rejections_carry_its_message(backend: HttpAlertmanagerBackend) -> None:
    with pytest.raises(ActionError, match=r"refused POST /api/v2/silences: HTTP 400: .*"):
        backend.create_silence({"node": ".*"}, None, datetime.now(UTC) + timedelta(hours=1),
                               BOT_AUTHOR, "matches everything", regex=["node"])
