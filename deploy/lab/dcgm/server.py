"""HTTP side of the DCGM-exporter simulator (stdlib only).

GET /metrics            every node's GPUs (what one exporter per node would give, merged)
GET /metrics?node=gpu02 one node only, like that node's own exporter (the lab's Prometheus
                        scrapes one target per node this way, so `up` is per node); 503
                        while the node's fault says exporter=down, 404 for unknown nodes
GET /health             200 "OK" (dcgm-exporter's health endpoint)
"""
from __future__ import annotations

import argparse
import logging
import signal
import sys
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any

from .exporter import exporter_down, read_faults, render

log = logging.getLogger("dcgm")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Exporter(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], nodes: list[str], faults: Path | None,
                 driver: str, gpus: int) -> None:
        super().__init__(address, Handler)
        self.nodes, self.faults, self.driver, self.gpus = nodes, faults, driver, gpus


class Handler(BaseHTTPRequestHandler):
    server: Exporter
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug(format, *args)

    def send(self, code: int, body: str, content_type: str = "text/plain; charset=utf-8") -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        srv = self.server
        if url.path == "/health":
            self.send(200, "OK")
            return
        if url.path != "/metrics":
            self.send(404, "404 page not found\n")
            return
        query = urllib.parse.parse_qs(url.query)
        nodes = srv.nodes
        if "node" in query:
            nodes = [n for value in query["node"] for n in value.split(",") if n]
            unknown = [n for n in nodes if n not in srv.nodes]
            if unknown:
                self.send(404, f"unknown node(s): {', '.join(unknown)}\n")
                return
            down = [n for n in nodes if exporter_down(read_faults(srv.faults, n))]
            if down:
                self.send(503, f"exporter down (lab fault) on {', '.join(down)}\n")
                return
        try:
            body = render(nodes, srv.faults, srv.driver, srv.gpus)
        except Exception:  # a bad fault file must not kill the exporter
            log.exception("rendering /metrics failed")
            self.send(500, "internal error\n")
            return
        self.send(200, body, CONTENT_TYPE)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dcgm", description="The lab's DCGM-exporter simulator.")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--faults", type=Path, help="lab faults folder ($LAB/faults)")
    p.add_argument("--nodes", default="gpu01", help="comma-separated node names")
    p.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    p.add_argument("--driver", default="535.161.08", help="default driver version label")
    p.add_argument("--log", type=Path, help="log file (default: stderr)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(
        filename=args.log, level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    nodes = [n for n in args.nodes.split(",") if n]
    server = Exporter((args.host, args.port), nodes, args.faults, args.driver, args.gpus)

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    log.info("dcgm-exporter simulator on %s:%d: %d nodes x %d GPUs", args.host, args.port,
             len(nodes), args.gpus)
    try:
        server.serve_forever(poll_interval=0.2)
    except (SystemExit, KeyboardInterrupt):
        pass
    finally:
        server.server_close()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
