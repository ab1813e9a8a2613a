"""Alert webhook to proposal: time from POST /alerts (Alertmanager's payload) to the answer
that carries the new proposal, against the bot's real HTTP server on a temporary SQLite
database, with its bearer token as Alertmanager sends it. Prints median and p99 over distinct
alerts. Goal: under 200 ms."""

from __future__ import annotations

import json
import secrets
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml
from benchkit import cleanup_on_signals, finish  # bench/, next to this file

from bot.config import Config
from bot.runtime.httpserver import HttpServer, Settings
from bot.runtime.serving import application
from bot.service import Service

RUNBOOK = {
    "name": "drain-node", "version": "1.0.0", "summary": "bench", "risk": "medium",
    "params": {"node": {"type": "node", "required": True}, "reason": {"type": "text"}},
    "locks": ["node:{{ node }}"],
    "steps": [{"id": "note", "action": "chat.notify", "with": {"message": "{{ node }}"}}],
}


def post_all(port: int, token: str, nodes: list[str]) -> list[float]:
    """One firing alert per node, one after the other; milliseconds to each answer."""
    timings = []
    for index, node in enumerate(nodes):
        body = json.dumps({"version": "4", "status": "firing", "alerts": [{
            "status": "firing", "fingerprint": f"fp{index}",
            "labels": {"alertname": "GpuXidUncorrectable", "node": node}}]}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/alerts", data=body,
                                         method="POST",
                                         headers={"Authorization": f"Bearer {token}",
                                                  "Content-Type": "application/json"})
        started = time.perf_counter()
        with urllib.request.urlopen(request, timeout=10) as response:
            answer = json.loads(response.read())
        timings.append((time.perf_counter() - started) * 1000)
        assert answer["proposals"][0]["params"]["node"] == node
    return timings


def main(count: int = 200) -> None:
    cleanup_on_signals()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "runbooks"
        folder.mkdir()
        (folder / "drain-node.yaml").write_text(yaml.safe_dump(RUNBOOK))
        nodes = [f"gpu{i:03d}" for i in range(count)]
        config = Config.model_validate({
            "database_url": f"sqlite:///{tmp}/bot.db", "database": {"create": True},
            "runbook_paths": [str(folder)],
            "inventory": {"nodes": nodes},
            "alert_rules": [{"match": {"alertname": "GpuXidUncorrectable"},
                             "runbook": "drain-node",
                             "params": {"node": "{{ labels.node }}", "reason": "XID 48"}}]})
        bot = Service.from_config(config)
        bot.runbooks()
        token = secrets.token_hex(32)
        server = HttpServer(application(bot, alerts_token=token), "127.0.0.1", 0, Settings())
        server.start()
        try:
            timings = post_all(server.port, token, nodes)
        finally:
            server.stop()
            bot.db.dispose()
    timings.sort()
    result = {"alerts": count, "median_ms": round(statistics.median(timings), 2),
              "p99_ms": round(timings[int(len(timings) * 0.99) - 1], 2)}
    result["goal_met"] = result["p99_ms"] < 200
    print(f"webhook to proposal over {count} alerts: median {result['median_ms']} ms, "
          f"p99 {result['p99_ms']} ms (goal < 200 ms: "
          f"{'met' if result['goal_met'] else 'NOT met'})")
    finish("alert_webhook", result)


if __name__ == "__main__":
    main()
