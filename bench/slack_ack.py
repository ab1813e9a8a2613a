"""Slack slash-command acknowledgement latency: p50 and p99 with 1 and with 20 concurrent
senders, while executions run (each waits in a step; the progress poster is live).

The bot is a real `runbook serve` process with the Slack surface in HTTP mode against the
lab's fake of Slack's Web API; requests are signed exactly as Slack signs them. Latency is from
sending the request to the HTTP answer (the ack). Goal: p99 < 100 ms (Slack allows 3,000 ms).
The floor beside it: GET /healthz from as many senders of the same kind, just before: what
any answer of this server costs on this machine (senders, server and Slack fake share it).

Needs a running lab: `deploy/lab/lab up && eval "$(deploy/lab/lab env)"`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml
from benchkit import cleanup_on_signals, finish  # bench/, next to this file

from bot.config import load_config, shipped_runbooks
from bot.service import Service
from tests.bot.surfaces.slack.slackhelp import FakeSlack, SlackClientSide, free_port

BUSY = """\
name: bench-busy
version: 1.0.0
summary: Waits in a step until asked (keeps an execution running during the benchmark).
risk: low
params:
  n: {type: int, required: true}
locks: ["bench:{{ n }}"]
steps:
  - id: wait
    action: chat.confirm
    with: {question: "stop waiting?", poll: 0.5}
    timeout: 10m
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(slack: SlackClientSide, senders: int, requests: int, text: str) -> list[float]:
    def one(_: int) -> float:
        status, _body, elapsed = slack.command(text, "U0ALICE")
        if status != 200:
            raise SystemExit(f"the bot answered {status}")
        return elapsed * 1000

    with ThreadPoolExecutor(senders) as pool:
        return list(pool.map(one, range(requests)))


def measure_floor(url: str, senders: int, requests: int) -> list[float]:
    """The floor: GET /healthz (one SELECT 1) from the same kind of sender, as many at once:
    what any answer of this server costs on this machine under the same load."""
    def one(_: int) -> float:
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=10) as answer:
            answer.read()
        return (time.perf_counter() - started) * 1000

    with ThreadPoolExecutor(senders) as pool:
        return list(pool.map(one, range(requests)))


def start_serve(config_file: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, RUNBOOK_CONFIG=str(config_file))
    serve = subprocess.Popen([sys.executable, "-m", "bot", "serve", "--port", str(port)],
                             env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).close()
            return serve
        except OSError:
            if serve.poll() is not None:
                sys.exit(f"runbook serve exited: {log.read_text()[-2000:]}")
            time.sleep(0.1)
    serve.kill()
    sys.exit("runbook serve did not answer /healthz within 60 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--running", type=int, default=4, help="executions running meanwhile")
    args = parser.parse_args()
    cleanup_on_signals()
    if not os.environ.get("SLACK_SIGNING_SECRET") or not os.environ.get("RUNBOOK_CONFIG"):
        sys.exit("needs the lab: deploy/lab/lab up && eval \"$(deploy/lab/lab env)\"")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "runbooks").mkdir()
        (folder / "runbooks" / "busy.yaml").write_text(BUSY)
        raw = yaml.safe_load(Path(os.environ["RUNBOOK_CONFIG"]).read_text())
        raw.update(database_url=f"sqlite:///{folder / 'bot.db'}",
                   runbook_paths=[str(shipped_runbooks()), str(folder / "runbooks")],
                   engine={"poll_seconds": 0.2})
        config_file = folder / "bot.yaml"
        config_file.write_text(yaml.safe_dump(raw))
        bot = Service.from_config(load_config(config_file))
        port = free_port()
        serve = start_serve(config_file, port, folder / "serve.log")
        try:
            fake = FakeSlack(os.environ["SLACK_API_URL"].rsplit("/api", 1)[0])
            slack = SlackClientSide(f"http://127.0.0.1:{port}/slack/events",
                                    os.environ["SLACK_SIGNING_SECRET"], fake)
            ids = [bot.request("bench-busy", {"n": str(n)}, "alice") for n in range(args.running)]
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and any(
                    bot.get(i).state != "running" for i in ids):
                time.sleep(0.1)
            running = sum(bot.get(i).state == "running" for i in ids)
            measure(slack, 4, 40, "help")  # warm up
            results = {}
            for senders in (1, 20):
                floor = measure_floor(f"http://127.0.0.1:{port}/healthz", senders,
                                      args.requests)
                latencies = measure(slack, senders, args.requests, f"status {ids[0]}")
                time.sleep(5)  # the commands' work (answers to response_url) is done
                results[senders] = {"p50_ms": round(statistics.median(latencies), 2),
                                    "p99_ms": round(percentile(latencies, 0.99), 2),
                                    "max_ms": round(max(latencies), 2),
                                    "floor_p50_ms": round(statistics.median(floor), 2),
                                    "floor_p99_ms": round(percentile(floor, 0.99), 2)}
                got = results[senders]
                print(f"{senders:>2} concurrent: p50 {got['p50_ms']} ms, p99 {got['p99_ms']} "
                      f"ms, max {got['max_ms']} ms over {args.requests} signed /runbook "
                      f"commands; floor (GET /healthz, same senders) p50 {got['floor_p50_ms']}"
                      f" ms, p99 {got['floor_p99_ms']} ms")
            for i in ids:
                bot.cancel(i, "alice")
        finally:
            serve.terminate()
            serve.wait(60)
        goal = all(r["p99_ms"] < 100 for r in results.values())
        print(f"executions running meanwhile: {running}; goal p99 < 100 ms: "
              f"{'met' if goal else 'NOT met'}")
        finish("slack_ack", {"bench": "slack_ack", "running": running,
                             "one": results[1], "twenty": results[20], "goal_met": goal})


if __name__ == "__main__":
    main()
