"""HTTP front: routing, content negotiation, verbs, watch streams and the API faults."""
from __future__ import annotations

import json
import logging
import select
import socket
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from . import errors, jobs, policy, resources, tables
from .audit import RequestLog
from .cluster import Cluster
from .errors import ApiError, Obj, status_body
from .faults import FaultSwitch
from .patch import json_patch, merge_patch, strategic_merge
from .resources import Resource
from .selectors import field_matcher, label_matcher, narrowing
from .store import Narrow, meta

log = logging.getLogger("kubeapi")
VERSION = {"major": "1", "minor": "29", "gitVersion": "v1.29.14", "gitTreeState": "clean",
           "gitCommit": "7d5fb5dd1a8f1e8e5f3f4c1c1a0e5b6f0a6c3a61",
           "buildDate": "2025-02-12T21:26:54Z", "goVersion": "go1.22.12", "compiler": "gc",
           "platform": "linux/amd64"}
MERGE, STRATEGIC, JSONPATCH = ("application/merge-patch+json",
                               "application/strategic-merge-patch+json",
                               "application/json-patch+json")
PROBE_HEADER = "X-Lab-Probe"  # the lab's readiness probe bypasses API faults
WATCH_DEFAULT_TIMEOUT = 1800
HANG_LIMIT = 600.0


class ApiServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], cluster: Cluster, switch: FaultSwitch,
                 request_log: RequestLog | None = None) -> None:
        super().__init__(address, Handler)
        self.cluster = cluster
        self.switch = switch
        self.request_log = request_log  # --audit-log: one JSON line per request
        self.closing = False


class Handler(BaseHTTPRequestHandler):
    # Headers and body go out in separate writes; with Nagle's algorithm on, a kept-alive
    # client waits ~40 ms for every response.
    disable_nagle_algorithm = True
    protocol_version = "HTTP/1.1"
    server: ApiServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug(format, *args)

    # One entry point for every verb.
    def do_GET(self) -> None:
        self.dispatch()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def dispatch(self) -> None:
        began = time.monotonic()
        self.code = 0
        self.recorded = False
        try:
            self.check_fault()
            self.route()
        except ApiError as exc:
            self.send_json(exc.code, exc.body(), exc.headers)
        except HangUp:
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # answer 500 like the real server, keep serving
            log.exception("request failed: %s %s", self.command, self.path)
            self.send_json(500, errors.internal(str(exc)).body())
        log.info("%s %s %s %.0fms", self.command, self.path, self.code or "-",
                 (time.monotonic() - began) * 1000)
        self.record(self.code)  # a hang-up has no answer: recorded here with code 0

    def record(self, code: int) -> None:
        """One request-log line, written before the answer goes out: a client that has its
        answer finds its line in the log (a line written after could race the client's read)."""
        self.code = code
        if self.recorded or self.server.request_log is None:
            return
        self.recorded = True
        self.server.request_log.record(self.command, self.path,
                                       self.headers.get("User-Agent", ""), code)

    def check_fault(self) -> None:
        if self.headers.get(PROBE_HEADER):
            return
        mode = self.server.switch.mode()
        if mode == "500":
            self.read_body()
            raise errors.internal("lab fault: the API server answers 500 (lab fault kube api=500)")
        if mode == "hang":
            deadline = time.monotonic() + HANG_LIMIT
            while self.server.switch.mode() == "hang" and time.monotonic() < deadline:
                if self.client_gone(0.2):
                    break
            raise HangUp  # close without an answer, as a stuck server would look

    def client_gone(self, wait: float) -> bool:
        readable, _, _ = select.select([self.connection], [], [], wait)
        if not readable:
            return False
        try:
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    # --- I/O -------------------------------------------------------------------

    def read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def json_body(self) -> Any:
        raw = self.read_body()
        try:
            return json.loads(raw or b"{}")
        except ValueError as exc:
            raise errors.bad_request(f"error decoding request body: {exc}") from None

    def send_json(self, code: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.record(code)
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        self.send_header("Audit-Id", str(uuid.uuid4()))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def send_text(self, code: int, text: str) -> None:
        data = text.encode()
        self.record(code)
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    # --- routing ---------------------------------------------------------------

    def route(self) -> None:
        url = urlsplit(self.path)
        path = url.path.rstrip("/") or "/"
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        fixed = self.fixed_document(path)
        if fixed is not None:
            self.send_json(200, fixed)
            return
        if path in ("/healthz", "/livez", "/readyz"):
            self.send_text(200, "ok")
            return
        parts = path.split("/")[1:]
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif parts[0] == "apis" and len(parts) > 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            self.read_body()
            self.send_text(404, "404 page not found\n")
            return
        namespace = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        res = resources.find(group, version, rest[0])
        if res is None or len(rest) > 3 or (namespace is not None and not res.namespaced):
            self.read_body()
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if name is not None and res.namespaced and namespace is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        self.serve_resource(res, namespace, name, sub, query)

    def fixed_document(self, path: str) -> Obj | None:
        if path == "/version":
            return VERSION
        if path == "/api":
            host, port = self.server.server_address[:2]
            return resources.api_versions(f"{host}:{port}")
        if path == "/api/v1":
            return resources.resource_list("", "v1")
        if path == "/apis":
            # Aggregated discovery (apidiscovery.k8s.io) is not served: the plain
            # APIGroupList with Content-Type application/json makes clients fall back.
            return resources.group_list()
        parts = path.split("/")[1:]
        if parts[0] == "apis" and len(parts) == 2 and parts[1] in resources.GROUPS:
            return resources.group_doc(parts[1])
        if parts[0] == "apis" and len(parts) == 3:
            return resources.resource_list(parts[1], parts[2])
        return None

    # --- verbs -----------------------------------------------------------------

    def serve_resource(self, res: Resource, ns: str | None, name: str | None, sub: str | None,
               query: dict[str, str]) -> None:
        store = self.server.cluster.store
        verb = self.command
        dry_run = query.get("dryRun") == "All"
        if sub not in (None, "status", "eviction", "log") or (
                sub in ("eviction", "log") and res.plural != "pods"):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if name is None:
            if verb == "GET":
                if query.get("watch") in ("1", "true", "True"):
                    self.watch(res, ns, query)
                else:
                    self.list_objects(res, ns, query)
                return
            if verb == "POST":
                if res.namespaced and ns is None:
                    raise errors.method_not_allowed("create", res.group, res.plural)
                self.send_json(201, store.create(res, ns or "", self.json_body(), dry_run))
                return
            raise errors.method_not_allowed(verb.lower(), res.group, res.plural)
        ns = ns or ""
        if sub == "log":
            self.pod_log(ns, name, query)
            return
        if sub == "eviction":
            if verb != "POST":
                raise errors.method_not_allowed(verb.lower(), "policy", "eviction")
            body = self.json_body()
            result = policy.evict(store, ns, name, body, dry_run,
                                  self.server.cluster.delete_pod)
            self.send_json(201, result)
        elif verb == "GET":
            self.respond_objects(res, [store.get(res, ns, name)], store.current_rv(), query,
                                 single=True)
        elif verb == "PUT":
            body = self.json_body()
            current = store.get(res, ns, name)
            body = _keep_part(body, current, sub)
            self.send_json(200, store.replace(res, ns, name, body, dry_run))
        elif verb == "PATCH":
            self.send_json(200, self.patch(res, ns, name, sub, dry_run))
        elif verb == "DELETE":
            options = self.json_body()  # DeleteOptions, optional
            if res.plural == "pods":
                if dry_run:
                    self.send_json(200, store.get(res, ns, name))
                    return
                grace = options.get("gracePeriodSeconds", _grace(query))
                pod = self.server.cluster.delete_pod(ns, name, grace)
                self.send_json(200, pod)
            else:
                if res.plural == "jobs" and not dry_run:  # its pods go first (GC's order)
                    jobs.delete_dependents(self.server.cluster, store.get(res, ns, name),
                                           options.get("propagationPolicy"))
                gone = store.delete(res, ns, name, dry_run)
                details = {"name": name, "kind": res.plural, "uid": meta(gone)["uid"]}
                if res.group:
                    details["group"] = res.group
                self.send_json(200, status_body("Success", 200, details=details))
        else:
            raise errors.method_not_allowed(verb.lower(), res.group, res.plural)

    def pod_log(self, ns: str, name: str, query: dict[str, str]) -> None:
        """GET .../pods/NAME/log: the container's output so far, as text (tailLines)."""
        if self.command != "GET":
            raise errors.method_not_allowed(self.command.lower(), "", "pods/log")
        pod = self.server.cluster.store.get(resources.by_kind("Pod"), ns, name)
        text = str((meta(pod).get("annotations") or {}).get(jobs.LOG, ""))
        tail = query.get("tailLines")
        if tail and tail.isdigit():
            text = "".join(text.splitlines(keepends=True)[-int(tail):])
        self.send_text(200, text)

    def patch(self, res: Resource, ns: str, name: str, sub: str | None, dry_run: bool) -> Obj:
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        accepted = [JSONPATCH, MERGE] + ([STRATEGIC] if res.builtin else [])
        if ctype not in accepted:
            self.read_body()
            raise errors.unsupported_media(accepted)
        body = self.json_body()
        if ctype != JSONPATCH and not isinstance(body, dict):
            raise errors.bad_request("the patch must be a JSON object")
        wanted_rv = body.get("metadata", {}).get("resourceVersion") \
            if isinstance(body, dict) and isinstance(body.get("metadata"), dict) else None

        def change(current: Obj) -> Obj:
            if ctype == JSONPATCH:
                patched = json_patch(current, body)
            elif ctype == MERGE:
                patched = merge_patch(current, body)
            else:
                patched = strategic_merge(current, body)
            return _keep_part(patched, current, sub)
        return self.server.cluster.store.modify(res, ns, name, change, wanted_rv, dry_run)

    def list_objects(self, res: Resource, ns: str | None, query: dict[str, str]) -> None:
        items, rv = self.server.cluster.store.select(res, ns, matcher(res, query),
                                                     narrowed(query))
        self.respond_objects(res, items, rv, query, single=False)

    def respond_objects(self, res: Resource, items: list[Obj], rv: str,
                        query: dict[str, str], single: bool) -> None:
        if tables.wants_table(self.headers.get("Accept", "")):
            self.send_json(200, tables.table(res, items, rv, query.get("includeObject", "")))
        elif single:
            self.send_json(200, items[0])
        else:
            self.send_json(200, {"kind": f"{res.kind}List", "apiVersion": res.api_version,
                                 "metadata": {"resourceVersion": rv}, "items": items})

    # --- watch -----------------------------------------------------------------

    def watch(self, res: Resource, ns: str | None, query: dict[str, str]) -> None:
        store = self.server.cluster.store
        match = matcher(res, query)
        as_table = tables.wants_table(self.headers.get("Accept", ""))
        include = query.get("includeObject", "")
        timeout = float(query.get("timeoutSeconds") or WATCH_DEFAULT_TIMEOUT)
        start = query.get("resourceVersion", "")
        self.record(200)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()

        def emit(kind: str, obj: Obj) -> None:
            if as_table:
                obj = tables.table(res, [obj], meta(obj).get("resourceVersion", ""), include)
            data = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        if start in ("", "0"):
            # No resourceVersion: the current state as ADDED events first, like the real one.
            items, rv = store.select(res, ns, match, narrowed(query))
            for obj in items:
                emit("ADDED", obj)
            last = int(rv)
        else:
            last = int(start)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline and self.server.switch.mode() == "ok":
                events = store.events_after(last, res.key, min(1.0, deadline - time.monotonic()))
                for rv_, _, kind, obj in events:
                    last = rv_
                    if (ns is None or meta(obj).get("namespace") == ns) and match(obj):
                        emit(kind, obj)
                if not events and self.client_gone(0):
                    return
        except ApiError as exc:
            emit("ERROR", exc.body())
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class HangUp(Exception):
    """Drop the connection without an answer."""


def matcher(res: Resource, query: dict[str, str]) -> Any:
    labels = label_matcher(query.get("labelSelector"))
    fields = field_matcher(query.get("fieldSelector"), res.kind)
    return lambda obj: labels(meta(obj).get("labels") or {}) and fields(obj)


def narrowed(query: dict[str, str]) -> Narrow:
    """The indexes a list may use (the watch cache's by label and spec.nodeName)."""
    labels, node = narrowing(query.get("labelSelector"), query.get("fieldSelector"))
    return Narrow(labels=labels, node=node)


def _keep_part(new: Obj, current: Obj, sub: str | None) -> Obj:
    """The main resource ignores status changes; the status subresource only takes them."""
    if sub == "status":
        return {**current, "status": new.get("status", {})}
    if "status" in current:
        return {**new, "status": current["status"]}
    new.pop("status", None)
    return new


def _grace(query: dict[str, str]) -> int | None:
    value = query.get("gracePeriodSeconds")
    return int(value) if value not in (None, "") else None
