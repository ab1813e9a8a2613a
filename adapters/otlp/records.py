"""Audit events as OpenTelemetry log records, built with the official generated messages of
``opentelemetry-proto``: one ExportLogsServiceRequest per batch, one LogRecord per event
(its time, the event's JSON as body, seq, hash, kind, actor and execution as attributes)."""

from __future__ import annotations

import calendar
import time
from collections.abc import Sequence
from datetime import datetime

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import (
    SEVERITY_NUMBER_INFO,
    LogRecord,
    ResourceLogs,
    ScopeLogs,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from adapters.auditlog import Event

SERVICE_NAME = "gpu-runbook-bot"
SCOPE_NAME = "gpu-runbook-bot.audit"


def unix_nanos(ts: str) -> int:
    """An event's time (UTC ISO-8601 with a Z) in nanoseconds since the epoch, exactly."""
    moment = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    return calendar.timegm(moment.utctimetuple()) * 1_000_000_000 + moment.microsecond * 1000


def _attribute(key: str, value: str | int) -> KeyValue:
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=value))


def log_record(event: Event, observed: int) -> LogRecord:
    attributes = [_attribute("audit.seq", event.seq), _attribute("audit.hash", event.hash),
                  _attribute("audit.prev_hash", event.prev_hash),
                  _attribute("audit.kind", event.kind), _attribute("audit.actor", event.actor)]
    if event.execution_id is not None:
        attributes.append(_attribute("audit.execution_id", event.execution_id))
    return LogRecord(time_unix_nano=unix_nanos(event.ts), observed_time_unix_nano=observed,
                     severity_number=SEVERITY_NUMBER_INFO, severity_text="INFO",
                     body=AnyValue(string_value=event.as_json()), attributes=attributes)


def export_request(events: Sequence[Event], host_name: str) -> ExportLogsServiceRequest:
    """One request for the batch, under the resource service.name=gpu-runbook-bot."""
    observed = time.time_ns()
    resource = Resource(attributes=[_attribute("service.name", SERVICE_NAME),
                                    _attribute("host.name", host_name)])
    scope = ScopeLogs(scope=InstrumentationScope(name=SCOPE_NAME),
                      log_records=[log_record(event, observed) for event in events])
    return ExportLogsServiceRequest(
        resource_logs=[ResourceLogs(resource=resource, scope_logs=[scope])])
