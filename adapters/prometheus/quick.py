"""``QuickPrometheus``: the node view's instant query over urllib3, without importing
requests and prometheus-api-client (a good part of ``runbook node``'s start).

The query goes through ``PrometheusApiBackend``'s own retry loop and error texts; only the
transport differs, and it sends what requests would (URL, headers, timeouts, no retries of
its own). Where requests would do more (TLS, proxies, a netrc, redirects, an undeclared
charset), or for any other call, the requests-based backend does it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import urllib3

from adapters.prometheus.backend import PrometheusApiBackend, Sample
from adapters.prometheus.config import PrometheusConfig
from kit.packages import package_version

# What requests sends by default (a test compares them with requests.utils.default_headers).
REQUESTS_VERSION = package_version("requests", "__version__.py")  # read, not imported
REQUESTS_HEADERS = {"User-Agent": f"python-requests/{REQUESTS_VERSION}",
                    "Accept-Encoding": "gzip, deflate",
                    "Accept": "*/*", "Connection": "keep-alive"}
REDIRECTS = (301, 302, 303, 307, 308)
TRUSTED_ENV = ("NETRC",)  # (a CA bundle from the environment does not touch plain HTTP)
PLAIN_URL = re.compile(r"http://[a-z0-9.\-]+(:[0-9]+)?(/[A-Za-z0-9._~\-/]*)?")


class Delegate(Exception):
    """Something requests does that the quick transport does not: ask through requests."""


class RequestException(OSError):
    """requests' exceptions, by the same names and bases, with the same text."""


class ConnectionFailed(RequestException):
    pass


class Timeout(RequestException):
    pass


class ConnectTimeout(ConnectionFailed, Timeout):
    pass


class SSLFailed(ConnectionFailed):
    pass


class AnswerError(Exception):
    """prometheus-api-client's exception for an answer other than 200."""


def quick_enough(config: PrometheusConfig) -> bool:
    """Whether requests would send exactly what the quick transport sends."""
    if not PLAIN_URL.fullmatch(config.url):  # TLS, credentials, a query, quoting: requests
        return False
    if any(key.lower().endswith("_proxy") and value for key, value in os.environ.items()):
        return False
    if any(os.environ.get(key) for key in TRUSTED_ENV):
        return False
    home = Path(os.path.expanduser("~"))
    return not any((home / name).exists() for name in (".netrc", "_netrc"))


class QuickPrometheus:
    """``PrometheusBackend``: ``query`` over urllib3 when ``quick_enough``, else and for
    everything else the requests-based ``PrometheusApiBackend``."""

    def __init__(self, config: PrometheusConfig) -> None:
        self.config = config
        self.full = PrometheusApiBackend(config)
        self.quick = _QuickBackend(config) if quick_enough(config) else None

    def query(self, promql: str, at: datetime | float | None = None, *,
              timeout: float | None = None) -> list[Sample]:
        if self.quick is not None:
            try:
                return self.quick.query(promql, at, timeout=timeout)
            except Delegate:
                pass
        return self.full.query(promql, at, timeout=timeout)

    def close(self) -> None:
        if self.quick is not None:
            self.quick.close()
        self.full.close()

    def __getattr__(self, name: str) -> Any:  # query_range, ready, alerts...: requests
        return getattr(self.full, name)


class _QuickBackend(PrometheusApiBackend):
    """The backend's retry loop and errors over ``_Client``."""

    def _connect(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = _Client(self.config, self._remember)
            return self._client

    def _errors(self) -> tuple[type[Exception], type[Exception], type[Exception],
                               type[Exception]]:
        return SSLFailed, Timeout, ConnectionFailed, AnswerError

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.pool.clear()
            self._client = None


class _Client:
    """prometheus-api-client's ``custom_query`` on a requests session, over urllib3."""

    def __init__(self, config: PrometheusConfig,
                 remember: Callable[..., None]) -> None:
        self.config = config
        self.remember = remember  # the backend reads error bodies from the last answer
        self.pool = urllib3.PoolManager(num_pools=10, maxsize=10, block=False)
        headers = {key.lower(): (key, value) for key, value in REQUESTS_HEADERS.items()}
        for key, value in (config.headers or {}).items():  # requests merges, any case
            headers[key.lower()] = (key, value)
        self.headers = dict(headers.values())

    def custom_query(self, query: str, params: dict[str, str] | None = None,
                     timeout: float | None = None) -> Any:
        url = f"{self.config.url}/api/v1/query?" + urlencode(
            {"query": str(query), **(params or {})}, doseq=True)
        answer = self._get(url, timeout)
        if answer.status_code == 200:
            return answer.json()["data"]["result"]
        raise AnswerError(f"HTTP Status Code {answer.status_code} ({answer.content!r})")

    def _get(self, url: str, limit: float | None) -> _Answer:
        """One GET as requests' HTTPAdapter sends it; its exceptions as requests maps them."""
        conn = self.pool.connection_from_url(url)
        split = urlsplit(url)
        try:
            response = conn.urlopen(
                "GET", f"{split.path or '/'}?{split.query}", body=None, headers=self.headers,
                redirect=False, assert_same_host=False, preload_content=False,
                decode_content=False, retries=urllib3.Retry(
                    total=0, raise_on_status=False, raise_on_redirect=False),
                timeout=urllib3.Timeout(connect=limit, read=limit), chunked=False)
        except (urllib3.exceptions.ProtocolError, OSError) as exc:
            raise ConnectionFailed(exc) from exc
        except urllib3.exceptions.MaxRetryError as exc:
            raise _retries_error(exc) from exc
        except urllib3.exceptions.ClosedPoolError as exc:
            raise ConnectionFailed(exc) from exc
        except urllib3.exceptions.SSLError as exc:
            raise SSLFailed(exc) from exc
        except urllib3.exceptions.ReadTimeoutError as exc:
            raise Timeout(exc) from exc
        except urllib3.exceptions.HTTPError as exc:  # requests raises these as they are
            raise Delegate(str(exc)) from exc
        try:
            content = response.read(decode_content=True)
        except urllib3.exceptions.ReadTimeoutError as exc:
            raise ConnectionFailed(exc) from exc
        except urllib3.exceptions.HTTPError as exc:  # ChunkedEncodingError... in requests
            raise Delegate(str(exc)) from exc
        answer = _Answer(response.status, response.reason or "", response.headers, content)
        if answer.status_code in REDIRECTS and "location" in response.headers:
            raise Delegate("a redirect: requests follows it")
        self.remember(answer)
        return answer


def _retries_error(exc: urllib3.exceptions.MaxRetryError) -> Exception:
    reason = exc.reason
    if isinstance(reason, urllib3.exceptions.ConnectTimeoutError) and not isinstance(
            reason, urllib3.exceptions.NewConnectionError):
        return ConnectTimeout(exc)
    if isinstance(reason, urllib3.exceptions.ResponseError):
        return Delegate(str(exc))  # requests' RetryError: not one of the backend's
    if isinstance(reason, urllib3.exceptions.SSLError):
        return SSLFailed(exc)
    return ConnectionFailed(exc)


class _Answer:
    """What the backend reads of a requests ``Response``: status, reason, text, json()."""

    def __init__(self, status: int, reason: str, headers: Any, content: bytes) -> None:
        self.status_code, self.reason, self.content = status, reason, content
        self.encoding = _encoding(headers.get("content-type"))
        if self.encoding is None and content:
            raise Delegate("no declared charset: requests guesses one")

    @property
    def text(self) -> str:
        if not self.content:
            return ""
        try:
            return str(self.content, self.encoding or "utf-8", errors="replace")
        except (LookupError, TypeError):
            return str(self.content, errors="replace")

    def json(self) -> Any:
        try:
            return json.loads(self.text)
        except json.JSONDecodeError as exc:
            raise json.JSONDecodeError(exc.msg, exc.doc, exc.pos) from exc


def _encoding(content_type: str | None) -> str | None:
    """requests.utils.get_encoding_from_headers."""
    if not content_type:
        return None
    kind, *params = content_type.split(";")
    for param in params:
        key, sep, value = param.strip().partition("=")
        if sep and key.strip("\"' ").lower() == "charset":
            return value.strip("\"' ").strip("'\"")
    if "text" in kind.strip():
        return "ISO-8859-1"
    if "application/json" in kind.strip():
        return "utf-8"
    return None
