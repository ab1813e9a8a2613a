"""Tests of the Prometheus adapter (adapters.prometheus).

Fast tests (no daemon): PromQL escaping and selectors, expectations, durations, the
configuration and the ``prom.wait`` arguments and plan; retries counted against a tiny
local HTTP server that answers 503 a given number of times (5xx retried, 4xx not).

``lab`` tests run a real Prometheus from Debian's package, started by this module (see
tests.adapters.monitoring) and scraping a stdlib ``/metrics`` server with DCGM-like
series, one of whose label values holds a double quote and a backslash. They cover
instant (vector, scalar, ``at``) and range queries, a bad query (Prometheus's own
message), no data (an empty list), escaping round trips and injection, Prometheus's own
alerts, a stopped Prometheus ("not answering", attempts and backoff counted), a server
that never answers (the request timeout honoured), and ``prom.wait``: success once a
value changes, a timeout listing the values seen, no data, and a rejected query.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from adapters.actions import ActionContext, ActionError, ActionTimeout
from adapters.prometheus import actions as prometheus_actions
from adapters.prometheus.actions import PrometheusActions, WaitArguments
from adapters.prometheus.backend import (
    PrometheusApiBackend,
    PrometheusError,
    PrometheusRejected,
    PrometheusUnavailable,
    Sample,
)
from adapters.prometheus.config import PrometheusConfig
from adapters.prometheus.promql import Expectation, escape_label_value, label_matcher, selector
from tests.adapters.monitoring import (
    MetricsServer,
    Monitoring,
    binaries,
    free_port,
    http_get,
    start_prometheus,
    wait_for,
)

TEMP = "DCGM_FI_DEV_GPU_TEMP"
UTIL = "DCGM_FI_DEV_GPU_UTIL"
WEIRD = 'we"ird\\host'  # a double quote and a backslash
RULES = """
groups:
  - name: test
    rules:
      - alert: TestAlwaysFiring
        expr: vector(1)
        labels: {severity: info}
        annotations: {summary: always}
"""


def ctx(seconds: float = 60) -> ActionContext:
    return ActionContext(execution_id=1, step_id="test", deadline=time.monotonic() + seconds)


def gpu(host: str, index: int) -> dict[str, str]:
    return {"gpu": str(index), "UUID": f"GPU-{host}-{index}", "modelName": "NVIDIA H100",
            "Hostname": host, "hostname": host}


# --- fast tests ---------------------------------------------------------------------

def test_escape_label_value() -> None:
    assert escape_label_value('a"b\\c\nd') == 'a\\"b\\\\c\\nd'
    assert escape_label_value("gpu07") == "gpu07"
    assert label_matcher("hostname", 'x"} or vector(1) #') == \
        'hostname="x\\"} or vector(1) #"'
    assert selector(TEMP, {"hostname": WEIRD, "gpu": "0"}) == \
        'DCGM_FI_DEV_GPU_TEMP{hostname="we\\"ird\\\\host",gpu="0"}'
    assert selector("up") == "up"
    with pytest.raises(ValueError, match="not a label name"):
        label_matcher("host-name", "x")
    with pytest.raises(ValueError, match="not a metric name"):
        selector("up or vector(1)")


@pytest.mark.parametrize(("text", "value", "ok"), [
    ("== 0", 0.0, True), ("==0", 1.0, False), ("< 5", 4.9, True), ("<5", 5.0, False),
    (">= 1e3", 1000.0, True), ("!= 0", float("nan"), False), ("> -1.5", -1.0, True),
    ("<= .5", 0.5, True),
])
def test_expectation(text: str, value: float, ok: bool) -> None:
    assert Expectation.parse(text)(value) is ok


def test_expectation_errors_say_what_to_write() -> None:
    for bad in ("0", "= 0", "== zero", "< 5 or 1"):
        with pytest.raises(ValueError, match="write an operator and a number"):
            Expectation.parse(bad)
    assert str(Expectation.parse("<5")) == "< 5"


def test_matchers_values_and_messages() -> None:
    from adapters.prometheus.promql import check_label_name, format_value

    assert [label_matcher("a", "x", op) for op in ("=", "!=", "=~", "!~")] == [
        'a="x"', 'a!="x"', 'a=~"x"', 'a!~"x"']
    with pytest.raises(ValueError) as caught:
        label_matcher("a", "x", "==")
    assert str(caught.value) == "'==' is not a label matcher operator (=, !=, =~, !~)"
    with pytest.raises(ValueError) as caught:
        check_label_name("0gpu")
    assert str(caught.value) == ("'0gpu' is not a label name (letters, digits and _, "
                                 "not starting with a digit)")
    assert [format_value(v) for v in (float("inf"), float("-inf"), float("nan"), 79.0, 0.5)] \
        == ["+Inf", "-Inf", "NaN", "79", "0.5"]
    with pytest.raises(ValueError) as caught:
        Expectation.parse("= 0")
    assert str(caught.value) == ("'= 0' is not an expectation: write an operator and a "
                                 "number, like == 0, != 0, < 5, <= 5, > 1 or >= 1")


def test_a_verdict_names_its_expectation_and_counts_the_rest() -> None:
    from adapters.prometheus.verdict import judge, listing

    samples = [Sample({"x": str(i)}, float(i)) for i in range(12)]
    verdict = judge(samples[:3], Expectation.parse("== 0"))
    assert verdict.expect == Expectation("==", 0.0) and not verdict.passed
    assert verdict.failure() == '2 of 3 series not == 0: {x="1"} 1, {x="2"} 2'
    assert listing(samples[:10]) == ", ".join(f'{{x="{i}"}} {i}' for i in range(10))
    assert listing(samples[:11]).endswith('{x="9"} 9 and 1 more')


def test_config_and_wait_arguments() -> None:
    config = PrometheusConfig(url="http://prometheus:9090/")
    assert (config.url, config.timeout, config.retries, config.retry_backoff,
            config.headers, config.verify_tls) == ("http://prometheus:9090", 10, 2, 0.5, None,
                                                   True)
    with pytest.raises(ValidationError, match="not a URL"):
        PrometheusConfig(url="prometheus:9090")
    with pytest.raises(ValidationError):
        PrometheusConfig(url="http://p:9090", retries=-1)
    args = WaitArguments(query="up", expect="== 1", timeout="10m", poll="2s")
    assert (args.timeout, args.poll) == (600, 2)
    with pytest.raises(ValidationError, match="write an operator and a number"):
        WaitArguments(query="up", expect="one")
    with pytest.raises(ValidationError, match="Extra inputs"):
        WaitArguments.model_validate({"query": "up", "expect": "== 1", "for_": "1m"})
    action = PrometheusActions(config).by_name()["prom.wait"]
    assert action.plan(args) == [
        "wait until every series of up is == 1: query http://prometheus:9090 every 2s, "
        "at most 10m (no data does not count as done)"]


def test_importing_the_adapter_does_not_load_the_http_client() -> None:
    import subprocess
    import sys

    code = ("import sys, adapters.prometheus, adapters.alertmanager; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('requests', 'urllib3', 'prometheus_api_client', 'dateparser')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"


class FlakyPrometheus:
    """Answers /api/v1/query: 503 ``failures`` times, then 200 with ``result`` (a vector);
    ``/bad`` queries get 400."""

    def __init__(self, failures: int, result: list[dict[str, Any]] | None = None) -> None:
        self.failures = failures
        self.result = [{"metric": {"a": "b"}, "value": [1.5, "7"]}] if result is None else result
        self.requests = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.requests += 1
                query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
                body: dict[str, Any]
                if query.get("query") == ["bad"]:
                    status, body = 400, {"status": "error", "errorType": "bad_data",
                                         "error": "invalid parameter \"query\": nope"}
                elif owner.requests <= owner.failures:
                    status, body = 503, {"status": "error", "errorType": "unavailable",
                                         "error": "too busy"}
                else:
                    status, body = 200, {"status": "success", "data": {
                        "resultType": "vector", "result": owner.result}}
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_5xx_is_retried_with_backoff_and_4xx_is_not() -> None:
    flaky = FlakyPrometheus(failures=2)
    pauses: list[float] = []
    try:
        backend = PrometheusApiBackend(
            PrometheusConfig(url=flaky.url, retries=2, retry_backoff=0.01), sleep=pauses.append)
        assert backend.query("up") == [Sample({"a": "b"}, 7.0, 1.5)]
        assert (flaky.requests, pauses) == (3, [0.01, 0.02])
        with pytest.raises(PrometheusRejected) as caught:
            backend.query("bad")
        assert flaky.requests == 4  # a 4xx is not retried
        assert str(caught.value) == ('Prometheus rejected the query (bad_data): '
                                     'invalid parameter "query": nope')
        flaky.failures, flaky.requests = 100, 0
        with pytest.raises(PrometheusUnavailable, match=r"HTTP 503: too busy; 3 attempts"):
            backend.query("up")
        assert flaky.requests == 3
    finally:
        flaky.stop()


def connections(listener: socket.socket) -> int:
    """How many connections wait in ``listener``'s backlog (taken, and closed, here)."""
    listener.setblocking(False)
    count = 0
    while True:
        try:
            taken, _ = listener.accept()
        except BlockingIOError:
            return count
        taken.close()
        count += 1


def test_a_server_that_never_answers_is_given_up_after_the_timeout() -> None:
    listener = socket.socket()  # accepts connections (backlog) but never answers
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        backend = PrometheusApiBackend(
            PrometheusConfig(url=url, timeout=0.3, retries=1, retry_backoff=0.05))
        with pytest.raises(PrometheusUnavailable) as caught:
            backend.query("up")
        assert caught.value.attempts == 2
        assert f"Prometheus at {url} is not answering (no answer within 0.3s; 2 attempts" \
            in str(caught.value)
        assert connections(listener) == 2  # each attempt connected, then gave up waiting
        assert backend.ready(timeout=0.2) is False
    finally:
        listener.close()


def series(labels: dict[str, str], value: str) -> dict[str, Any]:
    return {"metric": labels, "value": [1.5, value]}


XID = "DCGM_FI_DEV_XID_ERRORS"
ONE_GPU = {"__name__": XID, "Hostname": "gpu01", "gpu": "3"}


def test_series_are_named_by_every_label() -> None:
    assert Sample({**ONE_GPU, "instance": "a:9400"}, 79.0).describe() == \
        'DCGM_FI_DEV_XID_ERRORS{Hostname="gpu01", gpu="3", instance="a:9400"} 79'
    assert Sample({"x": 'a"b'}, float("nan")).describe() == '{x="a\\"b"} NaN'
    assert Sample({}, float("inf")).describe() == "{} +Inf"
    assert Sample({"__name__": "not a name", "a": "b"}, 0.25).describe() == \
        '{__name__="not a name", a="b"} 0.25'


@pytest.mark.parametrize("failing_first", [True, False])
def test_wait_judges_series_that_differ_only_in_instance_apart(failing_first: bool) -> None:
    """One GPU seen by two exporters (only ``instance`` differs), one of them reporting an
    XID: prom.wait must not be done, and its failure names that series by every label."""
    answer = [series({**ONE_GPU, "instance": "a:9400"}, "79"),
              series({**ONE_GPU, "instance": "b:9400"}, "0")]
    server = FlakyPrometheus(failures=0, result=answer if failing_first else answer[::-1])
    try:
        action = PrometheusActions(PrometheusConfig(url=server.url, retries=0),
                                   sleep=lambda s: None).by_name()["prom.wait"]
        seen: list[str] = []
        context = ctx()
        context.progress = seen.append
        with pytest.raises(ActionTimeout) as caught:
            action.run(WaitArguments(query=XID, expect="== 0", timeout=0.3, poll=0.1), context)
        failing = 'DCGM_FI_DEV_XID_ERRORS{Hostname="gpu01", gpu="3", instance="a:9400"} 79'
        assert str(caught.value).endswith(f": 1 of 2 series still off: {failing}")
        assert seen and seen[0] == f"waiting for {XID} == 0: {failing}"
        # A ``sum by (x)`` answer: no metric name, no host or GPU label.
        server.result = [series({"x": "1"}, "0"), series({"x": "2"}, "2"),
                         series({"x": "3"}, "0")]
        with pytest.raises(ActionTimeout, match=r': 1 of 3 series still off: \{x="2"\} 2$'):
            action.run(WaitArguments(query="sum by (x) (e)", expect="== 0", timeout=0.3,
                                     poll=0.1), ctx())
        server.result = [series({"x": str(i)}, "0") for i in range(3)]
        done = action.run(WaitArguments(query="sum by (x) (e)", expect="== 0", timeout=1),
                          ctx())
        assert done.summary.startswith("every series of sum by (x) (e) is == 0 (3 series, ")
    finally:
        server.stop()


def test_wait_names_the_first_ten_failing_series_and_counts_the_rest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    answer = [series({"x": str(i)}, str(i)) for i in range(13)]
    server = FlakyPrometheus(failures=0, result=answer)
    # a clock the test moves (a second per poll): each query has seconds of real time to
    # answer, however busy the machine, and the wait still ends after a few polls
    now = [1000.0]
    monkeypatch.setattr(prometheus_actions, "time",
                        SimpleNamespace(monotonic=lambda: now[0]))
    try:
        action = PrometheusActions(PrometheusConfig(url=server.url, retries=0),
                                   sleep=lambda s: now.__setitem__(0, now[0] + 1.0)
                                   ).by_name()["prom.wait"]
        with pytest.raises(ActionTimeout) as caught:
            action.run(WaitArguments(query="e", expect="== 0", timeout=5, poll=1), ctx())
        message = str(caught.value)
        assert message.endswith(": 12 of 13 series still off: "
                                + ", ".join(f'{{x="{i}"}} {i}' for i in range(1, 11))
                                + " and 2 more")
    finally:
        server.stop()


# --- against a real Prometheus --------------------------------------------------------

@pytest.fixture(scope="module")
def monitoring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Monitoring]:
    prometheus, _ = binaries()
    folder = tmp_path_factory.mktemp("prometheus")
    handle = Monitoring(dir=folder, metrics=MetricsServer())
    metrics = handle.metrics
    assert metrics is not None
    for host, temps in (("gpu01", (45, 47)), ("gpu02", (51, 52))):
        for index, temp in enumerate(temps):
            metrics.set(TEMP, gpu(host, index), temp)
            metrics.set(UTIL, gpu(host, index), 80)
    metrics.set(TEMP, gpu(WEIRD, 0), 61)
    try:
        daemon, handle.prometheus_url = start_prometheus(
            folder, prometheus, [f"127.0.0.1:{metrics.port}"], rules=RULES)
        handle.daemons.append(daemon)
        url = handle.prometheus_url

        def scraped() -> bool:
            status, body = http_get(f"{url}/api/v1/query?query=count({TEMP})")
            return status == 200 and bool(json.loads(body)["data"]["result"])

        wait_for("the first scrape of the metrics server", scraped, 60, handle.daemons)
    except BaseException:
        handle.stop()
        raise
    yield handle
    handle.stop()


@pytest.fixture
def backend(monitoring: Monitoring) -> PrometheusApiBackend:
    return PrometheusApiBackend(PrometheusConfig(url=monitoring.prometheus_url, timeout=5))


@pytest.fixture
def metrics(monitoring: Monitoring) -> MetricsServer:
    assert monitoring.metrics is not None
    return monitoring.metrics


@pytest.mark.lab
def test_instant_query_returns_samples_with_labels(backend: PrometheusApiBackend) -> None:
    assert backend.ready() is True
    samples = backend.query(selector(TEMP, {"hostname": "gpu01"}))
    by_gpu = {s.labels["gpu"]: s for s in samples}
    assert sorted(by_gpu) == ["0", "1"]
    first = by_gpu["0"]
    assert first.value == 45.0
    assert first.timestamp > time.time() - 60
    assert {k: first.labels[k] for k in ("__name__", "Hostname", "hostname", "UUID", "job")} \
        == {"__name__": TEMP, "Hostname": "gpu01", "hostname": "gpu01", "UUID": "GPU-gpu01-0",
            "job": "dcgm"}
    assert first.describe().startswith(f'{TEMP}{{Hostname="gpu01", UUID="GPU-gpu01-0", ')
    assert first.describe().endswith('job="dcgm", modelName="NVIDIA H100"} 45')
    (hottest,) = backend.query(f"max({TEMP})")
    assert (hottest.labels, hottest.value) == ({}, 61.0)


@pytest.mark.lab
def test_scalar_results_and_evaluation_time(backend: PrometheusApiBackend) -> None:
    (scalar,) = backend.query("1 + 2")
    assert (scalar.labels, scalar.value) == ({}, 3.0)
    (at,) = backend.query("time()", at=1_700_000_000.5)
    assert at.value == 1_700_000_000.5
    (nan,) = backend.query("scalar(vector(0) / 0)")
    assert nan.value != nan.value  # NaN arrives as a float NaN


@pytest.mark.lab
def test_range_query(backend: PrometheusApiBackend, metrics: MetricsServer) -> None:
    wait_for("three scrapes", lambda: metrics.scrapes >= 3, 30)
    now = time.time() + 1  # the client rounds start and end to whole seconds
    series = backend.query_range(selector(TEMP, {"hostname": "gpu02", "gpu": "1"}),
                                 now - 60, now, "1s")
    (only,) = series
    assert only.labels["hostname"] == "gpu02"
    assert len(only.points) >= 2
    assert all(value == 52.0 for _, value in only.points)
    times = [t for t, _ in only.points]
    assert times == sorted(times) and times[1] - times[0] == 1.0
    assert backend.query_range(f'{TEMP}{{hostname="nosuch"}}', now - 60, now, 5) == []


@pytest.mark.lab
def test_a_bad_query_carries_prometheus_own_message(backend: PrometheusApiBackend,
                                                    monitoring: Monitoring) -> None:
    query = f"sum({TEMP}"
    status, body = http_get(f"{monitoring.prometheus_url}/api/v1/query?"
                            + urllib.parse.urlencode({"query": query}))
    own = json.loads(body)
    assert (status, own["errorType"]) == (400, "bad_data")
    with pytest.raises(PrometheusRejected) as caught:
        backend.query(query)
    assert str(caught.value) == f"Prometheus rejected the query (bad_data): {own['error']}"
    assert (caught.value.error_type, caught.value.status) == ("bad_data", 400)
    with pytest.raises(PrometheusError, match="range vector"):
        backend.query(f"{TEMP}[1m]")


@pytest.mark.lab
def test_no_data_is_an_empty_list(backend: PrometheusApiBackend) -> None:
    assert backend.query(selector(TEMP, {"hostname": "gpu99"})) == []
    assert backend.query("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL") == []


@pytest.mark.lab
def test_escaped_label_values_round_trip(backend: PrometheusApiBackend) -> None:
    (sample,) = backend.query(selector(TEMP, {"hostname": WEIRD}))
    assert (sample.labels["hostname"], sample.labels["Hostname"], sample.value) == \
        (WEIRD, WEIRD, 61.0)
    (again,) = backend.query(f'{TEMP}{{Hostname="{escape_label_value(WEIRD)}"}}')
    assert again.labels == sample.labels
    # A value crafted to end the string and add a clause stays a value: no data.
    assert backend.query(selector(TEMP, {"hostname": 'gpu01"} or vector(1) #'})) == []


@pytest.mark.lab
def test_prometheus_alerts(backend: PrometheusApiBackend) -> None:
    def firing() -> list[dict[str, Any]]:
        return [a for a in backend.alerts()
                if a["labels"].get("alertname") == "TestAlwaysFiring" and a["state"] == "firing"]

    wait_for("the always-firing rule", lambda: bool(firing()), 30)
    (alert,) = firing()
    assert alert["labels"]["severity"] == "info"
    assert alert["annotations"] == {"summary": "always"}


@pytest.mark.lab
def test_a_stopped_prometheus_is_not_answering(tmp_path: Path) -> None:
    prometheus, _ = binaries()
    daemon, url = start_prometheus(tmp_path / "short-lived", prometheus, [])
    pauses: list[float] = []
    backend = PrometheusApiBackend(PrometheusConfig(url=url, timeout=2, retry_backoff=0.2),
                                   sleep=pauses.append)
    try:
        assert backend.ready() is True
        assert backend.query("vector(1)")[0].value == 1.0
    finally:
        daemon.stop()
    began = time.monotonic()
    with pytest.raises(PrometheusUnavailable) as caught:
        backend.query("vector(1)")
    assert time.monotonic() - began < 2
    assert str(caught.value).startswith(
        f"Prometheus at {url} is not answering (connection refused; 3 attempts in ")
    assert (caught.value.attempts, pauses) == (3, [0.2, 0.4])
    assert backend.ready() is False
    # The caller's budget wins over the retries.
    pauses.clear()
    with pytest.raises(PrometheusUnavailable) as caught:
        backend.query("vector(1)", timeout=0.3)
    assert (caught.value.attempts, pauses) == (2, [0.2])


def test_a_refused_port_counts_every_attempt() -> None:
    pauses: list[float] = []
    url = f"http://127.0.0.1:{free_port()}"
    backend = PrometheusApiBackend(PrometheusConfig(url=url, retries=4, retry_backoff=0.01),
                                   sleep=pauses.append)
    with pytest.raises(PrometheusUnavailable, match="connection refused; 5 attempts"):
        backend.query_range("up", 0, 60, "15s")
    assert pauses == [0.01, 0.02, 0.04, 0.08]


# --- prom.wait ----------------------------------------------------------------------

def wait_action(monitoring: Monitoring) -> Any:
    config = PrometheusConfig(url=monitoring.prometheus_url, timeout=5)
    return PrometheusActions(config).by_name()["prom.wait"]


@pytest.mark.lab
def test_wait_succeeds_once_the_value_changes(monitoring: Monitoring,
                                              metrics: MetricsServer) -> None:
    action = wait_action(monitoring)
    query = selector(UTIL, {"hostname": "gpu02"})

    def cool_down() -> None:
        for i in (0, 1):
            metrics.set(UTIL, gpu("gpu02", i), 0)

    timer = threading.Timer(1.0, cool_down)
    seen: list[str] = []
    timer.start()
    try:
        context = ctx()
        context.progress = seen.append
        result = action.run(WaitArguments(query=query, expect="== 0", timeout=30, poll=0.2),
                            context)
    finally:
        timer.cancel()
        for i in (0, 1):
            metrics.set(UTIL, gpu("gpu02", i), 80)
    assert result.changed is False
    assert result.summary.startswith(f"every series of {query} is == 0 (2 series, after ")
    assert [v["value"] for v in result.details["values"]] == [0.0, 0.0]
    assert result.details["polls"] > 1
    assert seen and "80" in seen[0]


@pytest.mark.lab
def test_wait_times_out_with_the_values_seen(monitoring: Monitoring) -> None:
    action = wait_action(monitoring)
    query = selector(TEMP, {"hostname": "gpu01"})
    began = time.monotonic()
    with pytest.raises(ActionTimeout) as caught:
        action.run(WaitArguments(query=query, expect="< 46", timeout=1, poll=0.2), ctx())
    assert time.monotonic() - began < 3
    message = str(caught.value)
    assert message.startswith(f"{query} not < 46 after ")
    assert "1 of 2 series still off: " in message
    assert 'gpu="1"' in message and message.endswith(" 47")


@pytest.mark.lab
def test_wait_fails_closed_on_no_data(monitoring: Monitoring) -> None:
    action = wait_action(monitoring)
    query = selector(TEMP, {"hostname": "gpu99"})
    with pytest.raises(ActionTimeout, match=r"^no data for " + query.replace("{", r"\{")):
        action.run(WaitArguments(query=query, expect="== 0", timeout=0.5, poll=0.2), ctx())


@pytest.mark.lab
def test_wait_fails_at_once_on_a_rejected_query(monitoring: Monitoring) -> None:
    action = wait_action(monitoring)
    began = time.monotonic()
    with pytest.raises(ActionError, match=r"Prometheus rejected the query \(bad_data\): "):
        action.run(WaitArguments(query="sum(", expect="== 0", timeout=30), ctx())
    assert time.monotonic() - began < 2
