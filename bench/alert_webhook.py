"""Alert webhook to proposal: time from POST /alerts (Alertmanager's payload) to the answer
that carries the new proposal, against the bot's real HTTP server on a temporary SQLite
database, with its bearer token as Alertmanager sends it. Prints median and p99 over distinct
alerts. Goal: under 200 ms."""

from __future__ import annotations

import json
import secrets
import socket
import statistics
import tempfile
import threading
import time
import urllib.request
from http.server import ThreadingHTTPServer
from pathlib import Path

import yaml

from bot.config import Config
from bot.runtime.serving import make_handler
from bot.service import Service

RUNBOOK = {
    "name": "drain-node", "version": "1.0.0", "summary": "bench", "risk": "medium",
    "params": {"node": {"type": "node", "required": True}, "reason": {"type": "text"}},
    "locks": ["node:{{ node }}"],
    "steps": [{"id": "note", "action": "chat.notify", "with": {"message": "{{ node }}"}}],
}


def main(count: int = 200) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "runbooks"
        folder.mkdir()
        (folder / "drain-node.yaml").write_text(yaml.safe_dump(RUNBOOK))
        nodes = [f"gpu{i:03d}" for i in range(count)]
        config = Config.model_validate({
            "database_url": f"sqlite:///{tmp}/bot.db", "runbook_paths": [str(folder)],
            "inventory": {"nodes": nodes},
            "alert_rules": [{"match": {"alertname": "GpuXidUncorrectable"},
                             "runbook": "drain-node",
                             "params": {"node": "{{ labels.node }}", "reason": "XID 48"}}]})
        bot = Service.from_config(config)
        bot.runbooks()
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        token = secrets.token_hex(32)
        server = ThreadingHTTPServer(("127.0.0.1", port), make_handler(bot, alerts_token=token))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        timings = []
        for index, node in enumerate(nodes):
            body = json.dumps({"version": "4", "status": "firing", "alerts": [{
                "status": "firing", "fingerprint": f"fp{index}",
                "labels": {"alertname": "GpuXidUncorrectable", "node": node}}]}).encode()
            request = urllib.request.Request(f"http://127.0.0.1:{port}/alerts", data=body,
                                             method="POST",
                                             headers={"Authorization": f"Bearer {token}"})
            started = time.perf_counter()
            with urllib.request.urlopen(request, timeout=10) as response:
                answer = json.loads(response.read())
            timings.append((time.perf_counter() - started) * 1000)
            assert answer["proposals"][0]["params"]["node"] == node
        server.shutdown()
    timings.sort()
    result = {"alerts": count, "median_ms": round(statistics.median(timings), 2),
              "p99_ms": round(timings[int(len(timings) * 0.99) - 1], 2)}
    print(f"webhook to proposal over {count} alerts: median {result['median_ms']} ms, "
          f"p99 {result['p99_ms']} ms (goal < 200 ms)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
