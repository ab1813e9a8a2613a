"""A small OTLP/HTTP logs receiver for the lab and the tests: decodes each
ExportLogsServiceRequest with opentelemetry-proto and appends every log record to a file as
one JSON line. Runs with the project's venv Python (it needs opentelemetry-proto)."""
