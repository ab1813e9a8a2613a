"""OTLP: the bot's audit log to an OpenTelemetry collector as log records over OTLP/HTTP
(protobuf, POST /v1/logs), built with the generated messages of ``opentelemetry-proto``.

    client = OtlpClient(OtlpConfig(endpoint="http://collector:4318"))
    client.send(events)   # DeliveryError unless the collector answered 200
"""

from typing import TYPE_CHECKING

from adapters.lazy import exports

if TYPE_CHECKING:
    from adapters.otlp.client import OtlpClient, read_headers
    from adapters.otlp.config import OtlpConfig
    from adapters.otlp.records import SERVICE_NAME, export_request, log_record, unix_nanos

__getattr__ = exports(__name__, {
    "adapters.otlp.client": ("OtlpClient", "read_headers"),
    "adapters.otlp.config": ("OtlpConfig",),
    "adapters.otlp.records": ("SERVICE_NAME", "export_request", "log_record", "unix_nanos"),
})

__all__ = ["SERVICE_NAME", "OtlpClient", "OtlpConfig", "export_request", "log_record",
           "read_headers", "unix_nanos"]
