"""Talking to Prometheus: the ``PrometheusBackend`` protocol and its implementation on
prometheus-api-client (``PrometheusConnect``).

The client and the requests/urllib3 stack under it are imported on first use, never when
this module is: the catalogue imports the adapters, and ``runbook --help`` must not pay for
an HTTP client.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from adapters.actions import MAX_PAUSE, ActionError
from adapters.prometheus.config import PrometheusConfig
from adapters.prometheus.promql import format_value, series_text
from kit.durations import parse_duration

if TYPE_CHECKING:
    import requests

T = TypeVar("T")


class PrometheusError(ActionError):
    """Prometheus could not answer a request; the message says why and what to check."""


class PrometheusUnavailable(PrometheusError):
    """No answer: connection refused, timeout or 5xx, after every retry.

    ``attempts`` is how many requests were sent (1 + retries, fewer when the time
    budget ran out first).
    """

    def __init__(self, message: str, attempts: int) -> None:
        super().__init__(message)
        self.attempts = attempts


class PrometheusRejected(PrometheusError):
    """Prometheus refused the request (4xx), e.g. a query that does not parse.

    ``error_type`` is Prometheus's own (``bad_data``, ``execution``...), ``error`` its text.
    """

    def __init__(self, message: str, error_type: str, error: str, status: int) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.error = error
        self.status = status


@dataclass(frozen=True)
class Sample:
    """One value of an instant query: a series of a vector, or the scalar (no labels)."""

    labels: dict[str, str]
    value: float
    timestamp: float = 0.0

    def series_text(self) -> str:
        """The series named by its whole label set: ``DCGM_FI_DEV_GPU_TEMP{gpu="0",
        hostname="gpu01"}`` (``{gpu="0"}`` without a metric name)."""
        return series_text(self.labels)

    def describe(self) -> str:
        """``DCGM_FI_DEV_GPU_TEMP{gpu="0", hostname="gpu01"} 45``: every label, the value."""
        return f"{self.series_text()} {format_value(self.value)}"


@dataclass(frozen=True)
class Series:
    """One series of a range query: ``points`` are (unix time, value), oldest first."""

    labels: dict[str, str]
    points: list[tuple[float, float]] = field(default_factory=list)


class PrometheusBackend(Protocol):
    """One method per HTTP API call. ``timeout`` is the caller's whole time budget for
    the call, retries included (None: no budget beyond ``config.timeout`` per request
    and ``config.retries``); each request is bounded by ``config.timeout``."""

    def query(self, promql: str, at: datetime | float | None = None, *,
              timeout: float | None = None) -> list[Sample]:
        """An instant query (``/api/v1/query``); no data is an empty list."""
        ...

    def query_range(self, promql: str, start: datetime | float, end: datetime | float,
                    step: float | str, *, timeout: float | None = None) -> list[Series]:
        """A range query (``/api/v1/query_range``); ``step`` in seconds or like ``15s``.
        prometheus-api-client rounds ``start`` and ``end`` to whole seconds."""
        ...

    def ready(self, *, timeout: float | None = None) -> bool:
        """Whether ``/-/ready`` answers 200 (never raises)."""
        ...

    def alerts(self, *, timeout: float | None = None) -> list[dict[str, Any]]:
        """Prometheus's own alerts (``/api/v1/alerts``): pending and firing."""
        ...


def _unix(value: datetime | float) -> float:
    return value.timestamp() if isinstance(value, datetime) else float(value)


def _number(text: Any) -> float:
    try:
        return float(text)  # Prometheus sends "NaN", "+Inf", "-Inf" as such
    except (TypeError, ValueError) as exc:
        raise PrometheusError(f"Prometheus returned {text!r} where a number was expected") \
            from exc


def _connection_problem(exc: BaseException, limit: float = 0.0) -> str:
    text = str(exc)
    if "timed out" in text and limit:
        return f"no answer within {limit:g}s"
    if "Connection refused" in text:
        return "connection refused"
    if any(s in text for s in ("Name or service not known", "name resolution",
                               "nodename nor servname", "No address associated")):
        return "cannot resolve the host name"
    if "Connection reset" in text or "RemoteDisconnected" in text:
        return "connection closed without an answer"
    return text[-200:]


def _samples(result: Any) -> list[Sample]:
    if not isinstance(result, list):
        raise PrometheusError(f"unexpected query result from Prometheus: {str(result)[:200]}")
    if len(result) == 2 and not isinstance(result[0], dict):  # scalar (or string): [t, "v"]
        return [Sample(labels={}, value=_number(result[1]), timestamp=float(result[0]))]
    samples = []
    for item in result:
        if "values" in item:
            raise PrometheusError(
                "the query returns a range vector (it ends in [duration]): use a range query, "
                "or wrap it in a function such as max_over_time(...) or rate(...)")
        timestamp, value = item["value"]
        samples.append(Sample(labels=dict(item.get("metric", {})), value=_number(value),
                              timestamp=float(timestamp)))
    return samples


def _series(result: Any) -> list[Series]:
    if not isinstance(result, list):
        raise PrometheusError(f"unexpected range result from Prometheus: {str(result)[:200]}")
    return [Series(labels=dict(item.get("metric", {})),
                   points=[(float(t), _number(v)) for t, v in item.get("values", [])])
            for item in result]


class PrometheusApiBackend:
    """``PrometheusBackend`` over prometheus-api-client's ``PrometheusConnect``."""

    def __init__(self, config: PrometheusConfig,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.config = config
        self._sleep = sleep
        self._local = threading.local()
        self._lock = threading.Lock()
        self._client: Any = None
        self._session: requests.Session | None = None

    # --- the client, created on first use ------------------------------------------

    def _remember(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        self._local.response = response

    def _connect(self) -> Any:
        with self._lock:
            if self._client is None:
                import requests
                from prometheus_api_client import PrometheusConnect
                from urllib3.util.retry import Retry

                session = requests.Session()
                session.verify = self.config.verify_tls
                session.hooks["response"].append(self._remember)
                self._session = session
                self._client = PrometheusConnect(
                    url=self.config.url, headers=dict(self.config.headers or {}) or None,
                    session=session, timeout=self.config.timeout,
                    retry=Retry(total=0, raise_on_status=False, raise_on_redirect=False))
            return self._client

    def close(self) -> None:
        with self._lock:
            if self._session is not None:
                self._session.close()
            self._client = self._session = None

    # --- retries and errors -----------------------------------------------------------

    @contextmanager
    def interruptible(self, stopping: Callable[[], bool]) -> Iterator[None]:
        """Within: this thread's calls look at ``stopping`` at least every ``MAX_PAUSE``
        seconds while waiting to retry, and give up (PrometheusUnavailable) when it says so.
        A request already sent is not interrupted (``config.timeout`` bounds it)."""
        before = getattr(self._local, "stopping", None)
        self._local.stopping = stopping
        try:
            yield
        finally:
            self._local.stopping = before

    def _pause(self, seconds: float) -> bool:
        """Wait ``seconds`` before a retry, in slices of at most MAX_PAUSE when a caller
        may ask to stop; False if it did."""
        stopping: Callable[[], bool] | None = getattr(self._local, "stopping", None)
        if stopping is None:
            self._sleep(seconds)
            return True
        left = seconds
        while left > 0:
            if stopping():
                return False
            step = min(left, MAX_PAUSE)
            self._sleep(step)
            left -= step
        return not stopping()

    def _call(self, fn: Callable[[Any, float], T], timeout: float | None) -> T:
        """``fn(client, request_timeout)``, retried on no answer; errors as PrometheusError.

        Retries are ours, not urllib3's (the client's adapter has ``Retry(0)``): on connection
        errors, timeouts and 5xx answers only, waiting ``retry_backoff``, then twice that...,
        never past the caller's time budget. A 4xx is Prometheus refusing the query; asking
        again would get the same answer. Error bodies come from the HTTP response itself (a
        session hook keeps the last one), so a rejected query carries Prometheus's own
        ``errorType`` and ``error`` text."""
        ssl_error, timeout_error, connection_error, answer_error = self._errors()
        client = self._connect()
        began = time.monotonic()
        budget = float("inf") if timeout is None else timeout
        attempts = 0
        while True:
            attempts += 1
            left = budget - (time.monotonic() - began)
            limit = round(max(0.05, min(self.config.timeout, left)), 3)
            self._local.response = None
            try:
                return fn(client, limit)
            except ssl_error as exc:
                raise PrometheusUnavailable(
                    f"Prometheus at {self.config.url} failed the TLS handshake "
                    f"({_connection_problem(exc)}); check the certificate or set "
                    "prometheus.verify_tls: false", attempts) from exc
            except timeout_error:
                problem = f"no answer within {limit:g}s"
            except connection_error as exc:  # urllib3's read timeouts land here too
                problem = _connection_problem(exc, limit)
            except answer_error as exc:
                response = self._local.response
                status = response.status_code if response is not None else 0
                if status and status < 500:
                    raise self._rejected(response) from exc
                problem = f"HTTP {status or '?'}{self._body_error(response)}"
            except (ValueError, KeyError) as exc:  # a 200 that is not Prometheus's JSON
                raise PrometheusError(
                    f"{self.config.url} answered, but not like Prometheus's HTTP API ({exc}); "
                    "check prometheus.url") from exc
            waited = time.monotonic() - began
            pause = self.config.retry_backoff * 2 ** (attempts - 1)
            if attempts > self.config.retries or waited + pause + 0.05 > budget:
                raise PrometheusUnavailable(
                    f"Prometheus at {self.config.url} is not answering ({problem}; "
                    f"{attempts} attempt{'s' if attempts > 1 else ''} in {waited:.1f}s)",
                    attempts)
            if not self._pause(pause):
                raise PrometheusUnavailable(
                    f"Prometheus at {self.config.url} is not answering ({problem}); stopped "
                    f"retrying when asked to stop ({attempts} attempt{'s' if attempts > 1 else ''}"
                    f" in {time.monotonic() - began:.1f}s)", attempts)

    def _errors(self) -> tuple[type[Exception], type[Exception], type[Exception],
                               type[Exception]]:
        """What the client raises: a TLS failure, a timeout, no connection, a non-200."""
        import requests
        from prometheus_api_client.exceptions import PrometheusApiClientException

        return (requests.exceptions.SSLError, requests.Timeout, requests.ConnectionError,
                PrometheusApiClientException)

    @staticmethod
    def _json(response: requests.Response | None) -> dict[str, Any]:
        if response is None:
            return {}
        try:
            body = response.json()
        except ValueError:
            return {}
        return body if isinstance(body, dict) else {}

    def _body_error(self, response: requests.Response | None) -> str:
        body = self._json(response)
        return f": {body['error']}" if body.get("error") else ""

    def _rejected(self, response: requests.Response) -> PrometheusError:
        body = self._json(response)
        status = response.status_code
        if body.get("status") == "error" and "error" in body:
            kind, error = str(body.get("errorType", "error")), str(body["error"])
            return PrometheusRejected(f"Prometheus rejected the query ({kind}): {error}",
                                      kind, error, status)
        text = " ".join(response.text.split())[:200]
        hint = {401: "check prometheus.headers (credentials)",
                403: "check prometheus.headers (credentials)",
                404: "check prometheus.url (a path prefix?)"}.get(status, "check prometheus.url")
        return PrometheusRejected(
            f"{self.config.url} refused the request: HTTP {status} {response.reason} "
            f"({text or 'no body'}); {hint}", "http", text, status)

    def _get(self, path: str, limit: float) -> Any:
        """GET ``path`` on the client's session; raises like the client does on non-200."""
        from prometheus_api_client.exceptions import PrometheusApiClientException

        assert self._session is not None
        response = self._session.get(f"{self.config.url}{path}", timeout=limit,
                                     headers=self.config.headers)
        if response.status_code != 200:
            raise PrometheusApiClientException(f"HTTP Status Code {response.status_code}")
        return response

    # --- the API --------------------------------------------------------------------

    def query(self, promql: str, at: datetime | float | None = None, *,
              timeout: float | None = None) -> list[Sample]:
        params = {} if at is None else {"time": f"{_unix(at):.3f}"}
        result = self._call(
            lambda client, limit: client.custom_query(promql, params=params, timeout=limit),
            timeout)
        return _samples(result)

    def query_range(self, promql: str, start: datetime | float, end: datetime | float,
                    step: float | str, *, timeout: float | None = None) -> list[Series]:
        seconds = parse_duration(step)
        if seconds <= 0:
            raise PrometheusError("the step of a range query must be positive")
        begin, finish = _unix(start), _unix(end)
        if finish < begin:
            raise PrometheusError("the end of a range query is before its start")
        # The client takes datetimes (and rounds them to seconds) and the step as text.
        first, last = datetime.fromtimestamp(begin, UTC), datetime.fromtimestamp(finish, UTC)
        result = self._call(
            lambda client, limit: client.custom_query_range(
                promql, start_time=first, end_time=last, step=f"{seconds:g}", timeout=limit),
            timeout)
        return _series(result)

    def ready(self, *, timeout: float | None = None) -> bool:
        self._connect()
        assert self._session is not None
        limit = self.config.timeout if timeout is None else max(0.05, timeout)
        try:
            response = self._session.get(f"{self.config.url}/-/ready", timeout=limit,
                                         headers=self.config.headers)
        except OSError:  # requests.RequestException is an OSError
            return False
        return response.status_code == 200

    def alerts(self, *, timeout: float | None = None) -> list[dict[str, Any]]:
        alerts = self._call(
            lambda client, limit: self._get("/api/v1/alerts", limit).json()["data"]["alerts"],
            timeout)
        return [dict(alert) for alert in alerts]
