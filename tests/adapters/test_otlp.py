"""The OTLP destination (adapters.otlp) against the lab's OTLP receiver, which the test
starts: one LogRecord per event built with opentelemetry-proto, and the collector's answers
read as the OTLP specification says (partial success, 4xx, 429 and 5xx, Retry-After)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from adapters.auditlog import DeliveryError, DestinationSetupError
from adapters.otlp.client import OtlpClient, read_headers
from adapters.otlp.config import OtlpConfig
from adapters.otlp.records import export_request, unix_nanos
from tests.adapters.auditevents import chain
from tests.adapters.receivers import OtlpSink


def client_for(endpoint: str, **settings: object) -> OtlpClient:
    return OtlpClient(OtlpConfig.model_validate({"endpoint": endpoint, "timeout_seconds": 5,
                                                 **settings}))


def test_each_event_is_a_log_record_of_the_bot() -> None:
    events = chain(5)
    request = export_request(events, "bot-host")
    (resource_logs,) = request.resource_logs
    resource = {kv.key: kv.value.string_value for kv in resource_logs.resource.attributes}
    assert resource == {"service.name": "gpu-runbook-bot", "host.name": "bot-host"}
    records = resource_logs.scope_logs[0].log_records
    assert [r.body.string_value for r in records] == [e.as_json() for e in events]
    first = {kv.key: kv.value for kv in records[0].attributes}
    assert first["audit.seq"].int_value == 1 and first["audit.hash"].string_value == (
        events[0].hash)
    assert first["audit.kind"].string_value == "step_finished"
    assert first["audit.actor"].string_value == "alice"
    assert first["audit.execution_id"].int_value == 7
    assert "audit.execution_id" not in {kv.key for kv in records[4].attributes}  # None: none
    assert records[0].time_unix_nano == unix_nanos(events[0].ts)
    assert unix_nanos("2026-03-04T05:06:07.123456Z") == 1772600767_123456000


def test_a_batch_reaches_the_receiver(otlp_sink: OtlpSink) -> None:
    events = chain(3)
    assert client_for(otlp_sink.endpoint).send(events).rejected == 0
    records = otlp_sink.records()
    assert [json.loads(r["body"]) for r in records] == [json.loads(e.as_json()) for e in events]
    assert records[1]["attributes"]["audit.seq"] == 2
    assert records[1]["resource"]["service.name"] == "gpu-runbook-bot"
    assert records[1]["severity_text"] == "INFO"


def test_gzip_and_a_full_logs_url(otlp_sink: OtlpSink) -> None:
    client_for(f"{otlp_sink.endpoint}/v1/logs", compression="gzip").send(chain(2))
    assert otlp_sink.seqs() == [1, 2]


def test_retryable_answers_and_retry_after(otlp_sink: OtlpSink) -> None:
    client = client_for(otlp_sink.endpoint)
    for status in (429, 503, 500):
        otlp_sink.fault(status=status, count=1, retry_after=2)
        with pytest.raises(DeliveryError, match=f"answered {status}") as failed:
            client.send(chain(1))
        assert failed.value.retryable and failed.value.retry_after == 2.0
    assert otlp_sink.seqs() == []


def test_other_4xx_are_refusals(otlp_sink: OtlpSink) -> None:
    otlp_sink.fault(status=400, count=1)
    with pytest.raises(DeliveryError, match="answered 400 Bad Request") as failed:
        client_for(otlp_sink.endpoint).send(chain(1))
    assert not failed.value.retryable
    with pytest.raises(DeliveryError, match="answered 404") as failed:
        client_for(f"{otlp_sink.endpoint}/v1/other").send(chain(1))
    assert not failed.value.retryable


def test_partial_success_is_accepted_with_its_count(otlp_sink: OtlpSink) -> None:
    otlp_sink.fault(reject=1, count=1)
    accepted = client_for(otlp_sink.endpoint).send(chain(3))
    assert (accepted.rejected, accepted.note) == (1, "rejected by the lab's fault")
    assert otlp_sink.seqs() == [1, 2]


def test_a_stopped_receiver_is_a_delivery_error(otlp_sink: OtlpSink) -> None:
    client = client_for(otlp_sink.endpoint)
    client.send(chain(1))
    otlp_sink.stop()
    with pytest.raises(DeliveryError, match="ConnectionError") as failed:
        client.send(chain(1, start=2))
    assert failed.value.retryable
    otlp_sink.start()
    client.send(chain(1, start=2))  # the same client, a new connection
    assert otlp_sink.seqs() == [1, 2]


def test_headers_come_from_a_file_never_from_the_configuration(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="secrets do not belong"):
        OtlpConfig.model_validate({"endpoint": "http://c:4318", "headers": {"a": "b"}})
    file = tmp_path / "headers"
    file.write_text("# the collector's key\nAuthorization: Bearer s3cret\n\nX-Scope: audit\n")
    config = OtlpConfig(endpoint="http://c:4318", headers_file=file)
    assert read_headers(config) == {"Authorization": "Bearer s3cret", "X-Scope": "audit"}
    file.write_text("Authorization Bearer s3cret\n")
    with pytest.raises(DestinationSetupError, match="line 1: not `Name: value`") as bad:
        OtlpClient(config)
    assert "s3cret" not in str(bad.value)
    with pytest.raises(DestinationSetupError, match="cannot read"):
        OtlpClient(OtlpConfig(endpoint="http://c:4318", headers_file=tmp_path / "none"))


def test_the_logs_url() -> None:
    assert OtlpConfig(endpoint="http://c:4318").logs_url == "http://c:4318/v1/logs"
    assert OtlpConfig(endpoint="http://c:4318/").logs_url == "http://c:4318/v1/logs"
    assert OtlpConfig(endpoint="https://c/otlp/v1/logs").logs_url == "https://c/otlp/v1/logs"
    with pytest.raises(ValidationError, match="need an https"):
        OtlpConfig(endpoint="http://c:4318", ca_file=Path("ca.pem"))
