"""Posting audit events to an OpenTelemetry collector over OTLP/HTTP (``OtlpClient``), and
reading its answer as the OTLP specification says: 200 accepted (perhaps partly), 429 and
5xx try again later (after Retry-After), any other 4xx refused as sent."""

from __future__ import annotations

import gzip
import socket
from collections.abc import Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import requests
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse

from adapters.auditlog import Accepted, DeliveryError, DestinationSetupError, Event
from adapters.otlp.config import OtlpConfig
from adapters.otlp.records import export_request

PROTOBUF = "application/x-protobuf"
RETRYABLE = frozenset({429, 502, 503, 504})  # the specification's list; other 5xx: also


def read_headers(config: OtlpConfig) -> dict[str, str]:
    """The ``Name: value`` lines of ``headers_file`` (blank lines and # comments skipped);
    an error names the file and line, never a value."""
    if config.headers_file is None:
        return {}
    try:
        lines = config.headers_file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DestinationSetupError(f"cannot read the OTLP headers file "
                                    f"{config.headers_file}: {exc}") from None
    headers: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, colon, value = line.partition(":")
        if not colon or not name.strip() or " " in name.strip():
            raise DestinationSetupError(f"{config.headers_file}, line {number}: not "
                                        "`Name: value`")
        headers[name.strip()] = value.strip()
    return headers


class OtlpClient:
    """Delivers batches of events to one collector; ``send`` raises DeliveryError unless the
    collector answered 200."""

    def __init__(self, config: OtlpConfig) -> None:
        self.config = config
        self.name = config.logs_url
        read_headers(config)  # a missing or malformed file stops the start, not a batch
        self._host = socket.gethostname()
        self._session: requests.Session | None = None  # kept alive between batches

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def send(self, events: Sequence[Event]) -> Accepted:
        body = export_request(events, self._host).SerializeToString()
        try:
            headers = {**read_headers(self.config), "Content-Type": PROTOBUF}
        except DestinationSetupError as exc:
            raise DeliveryError(str(exc), retryable=False) from None
        if self.config.compression == "gzip":
            body, headers["Content-Encoding"] = gzip.compress(body), "gzip"
        if self._session is None:
            self._session = requests.Session()
        try:
            response = self._session.post(self.name, data=body, headers=headers,
                                          timeout=self.config.timeout_seconds,
                                          allow_redirects=False, **self._tls())
        except requests.RequestException as exc:
            raise DeliveryError(f"{self.name}: {type(exc).__name__}: {exc}") from None
        return answer(self.name, response)

    def _tls(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        if self.config.ca_file:
            found["verify"] = str(self.config.ca_file)
        if self.config.cert_file and self.config.key_file:
            found["cert"] = (str(self.config.cert_file), str(self.config.key_file))
        return found


def answer(url: str, response: requests.Response) -> Accepted:
    """What the collector's answer means for the batch (OTLP/HTTP, "Failures")."""
    status = response.status_code
    if status == 200:
        return _accepted(response)
    said = f"{url} answered {status} {response.reason}{_detail(response)}"
    if status in RETRYABLE or 500 <= status < 600:
        raise DeliveryError(said, retry_after=_retry_after(response))
    raise DeliveryError(said, retryable=False)


def _accepted(response: requests.Response) -> Accepted:
    if not response.content or PROTOBUF not in response.headers.get("Content-Type", ""):
        return Accepted()
    parsed = ExportLogsServiceResponse()
    try:
        parsed.ParseFromString(response.content)
    except Exception:  # protobuf's DecodeError: the batch was taken all the same
        return Accepted(note="the collector's answer could not be read")
    partial = parsed.partial_success
    return Accepted(rejected=int(partial.rejected_log_records), note=partial.error_message)


def _detail(response: requests.Response) -> str:
    kind = response.headers.get("Content-Type", "")
    if kind.startswith(("text/", "application/json")) and response.text.strip():
        return f": {response.text.strip()[:200]}"
    return ""


def _retry_after(response: requests.Response) -> float | None:
    value = response.headers.get("Retry-After", "").strip()
    if not value:
        return None
    if value.isdigit():
        return float(value)
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max((moment - datetime.now(UTC)).total_seconds(), 0.0)
