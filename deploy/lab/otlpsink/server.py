"""The receiver: POST /v1/logs (application/x-protobuf, gzip or not) answers 200 with an
ExportLogsServiceResponse after appending each record to the output file as JSON:
{"time_unix_nano", "observed_time_unix_nano", "severity_number", "severity_text", "body",
"attributes", "resource", "scope"}. Faults for tests: POST /_lab/fault with
{"status": 503, "count": N, "retry_after": S} (answer that, write nothing),
{"reject": N} (partial success: the last N records dropped), {"delay": S} (write, then wait
S seconds before answering); {} clears. GET /_lab/health answers 200.
"""
from __future__ import annotations

import gzip
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

PROTOBUF = "application/x-protobuf"


def plain(value: AnyValue) -> Any:
    """An AnyValue as the JSON value it holds."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "kvlist_value":
        return {kv.key: plain(kv.value) for kv in value.kvlist_value.values}
    if kind == "array_value":
        return [plain(item) for item in value.array_value.values]
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind)


def records(request: ExportLogsServiceRequest) -> list[dict[str, Any]]:
    found = []
    for resource_logs in request.resource_logs:
        resource = {kv.key: plain(kv.value) for kv in resource_logs.resource.attributes}
        for scope_logs in resource_logs.scope_logs:
            for record in scope_logs.log_records:
                found.append({
                    "time_unix_nano": record.time_unix_nano,
                    "observed_time_unix_nano": record.observed_time_unix_nano,
                    "severity_number": record.severity_number,
                    "severity_text": record.severity_text, "body": plain(record.body),
                    "attributes": {kv.key: plain(kv.value) for kv in record.attributes},
                    "resource": resource, "scope": scope_logs.scope.name})
    return found


class Sink:
    """The output file, the request log and the armed fault, shared by the handlers."""

    def __init__(self, out: Path, log: Path | None) -> None:
        self.out, self.log = out, log
        self.fault: dict[str, Any] = {}
        self.lock = threading.Lock()

    def take_fault(self) -> dict[str, Any]:
        with self.lock:
            fault = dict(self.fault)
            if "count" in self.fault:
                self.fault["count"] -= 1
                if self.fault["count"] <= 0:
                    self.fault = {}
            return fault

    def write(self, found: list[dict[str, Any]]) -> None:
        with self.lock, self.out.open("a", encoding="utf-8") as out:
            for record in found:
                out.write(json.dumps(record, sort_keys=True) + "\n")

    def note(self, line: str) -> None:
        if self.log is not None:
            with self.lock, self.log.open("a", encoding="utf-8") as out:
                out.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n")


class Handler(BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # the base names it so
        self.server.sink.note(format % args)

    def do_GET(self) -> None:
        self.answer(200 if self.path == "/_lab/health" else 404, b"ok\n", "text/plain")

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/_lab/fault":
            self.server.sink.fault = json.loads(body or b"{}")
            self.answer(200, b"{}", "application/json")
        elif self.path != "/v1/logs":
            self.answer(404, b"not found\n", "text/plain")
        elif not self.headers.get("Content-Type", "").startswith(PROTOBUF):
            self.answer(415, b"application/x-protobuf only\n", "text/plain")
        else:
            self.export(body)

    def export(self, body: bytes) -> None:
        fault = self.server.sink.take_fault()
        if "status" in fault:
            extra = {"Retry-After": str(fault["retry_after"])} if "retry_after" in fault else {}
            self.answer(int(fault["status"]), b"fault armed\n", "text/plain", extra)
            return
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request = ExportLogsServiceRequest()
        request.ParseFromString(body)
        found = records(request)
        rejected = min(int(fault.get("reject", 0)), len(found))
        self.server.sink.write(found[: len(found) - rejected])
        time.sleep(float(fault.get("delay", 0)))
        response = ExportLogsServiceResponse()
        if rejected:
            response.partial_success.rejected_log_records = rejected
            response.partial_success.error_message = "rejected by the lab's fault"
        self.answer(200, response.SerializeToString(), PROTOBUF)

    def answer(self, status: int, body: bytes, kind: str,
               extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in {"Content-Type": kind, "Content-Length": str(len(body)),
                            **(extra or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], sink: Sink) -> None:
        super().__init__(address, Handler)
        self.sink = sink


def serve(host: str, port: int, out: Path, log: Path | None) -> Server:
    out.parent.mkdir(parents=True, exist_ok=True)
    return Server((host, port), Sink(out, log))
