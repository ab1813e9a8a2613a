"""OTLP: the bot's audit log to an OpenTelemetry collector as log records over OTLP/HTTP
(protobuf, POST /v1/logs), built with the generated messages of ``opentelemetry-proto``.

    client = OtlpClient(OtlpConfig(endpoint="http://collector:4318"))
    client.send(events)   # DeliveryError unless the collector answered 200
"""
