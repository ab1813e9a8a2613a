"""Slack slash-command acknowledgement latency: p50 and p99 with 1, 20 and 50 concurrent
senders, while executions run (each waits in a step; the progress poster is live).

The bot is a real `runbook serve` process with the Slack surface in HTTP mode against the
lab's fake of Slack's Web API, started alone (no other lab daemon is needed); requests are
signed exactly as Slack signs them. Latency is from sending the request to the HTTP answer
(the ack). Goal: p99 < 50 ms at 50 senders (Slack allows 3,000 ms). The floors beside it,
from as many senders of the same kind in the same run: GET /livez (answered on the server's
event loop: no bot work at all) and GET /healthz (a worker thread and one SELECT 1).
Every command must then be answered exactly once at its response_url.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml
from benchkit import cleanup_on_signals, finish  # bench/, next to this file

from bot.config import load_config
from bot.service import Service
from tests.bot.surfaces.slack.slackhelp import (
    FakeSlack,
    SlackClientSide,
    free_port,
    standalone_fake,
)

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
SENDERS = (1, 20, 50)
USERS = {"alice": {"groups": ["oncall"]}, "carol": {"groups": ["gpu-leads"]}}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def figures(latencies: list[float]) -> dict[str, float]:
    return {"p50_ms": round(statistics.median(latencies), 2),
            "p99_ms": round(percentile(latencies, 0.99), 2),
            "max_ms": round(max(latencies), 2)}


def measure(slack: SlackClientSide, senders: int, bodies: list[str]) -> list[float]:
    """Each body (made beforehand, with its response_url) signed and sent; ms to the ack."""
    def one(body: str) -> float:
        status, _answer, elapsed = slack.post(body)
        if status != 200:
            raise SystemExit(f"the bot answered {status}")
        return elapsed * 1000

    with ThreadPoolExecutor(senders) as pool:
        return list(pool.map(one, bodies))


def measure_floor(url: str, senders: int, requests: int) -> list[float]:
    """GET ``url`` from the same kind of sender, as many at once."""
    def one(_: int) -> float:
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=10) as answer:
            answer.read()
        return (time.perf_counter() - started) * 1000

    with ThreadPoolExecutor(senders) as pool:
        return list(pool.map(one, range(requests)))


def answered(fake: FakeSlack, urls: set[str], seconds: float = 120) -> dict[str, int]:
    """Wait until every response_url in ``urls`` got a post: how many got 0, 1, more."""
    deadline = time.monotonic() + seconds
    while True:
        posts = {r["id"]: len(r["posts"]) for r in fake.responses()}
        counts = [posts.get(url.rsplit("/", 1)[1], 0) for url in urls]
        if all(counts) or time.monotonic() > deadline:
            return {"none": counts.count(0), "once": counts.count(1),
                    "more": sum(c > 1 for c in counts)}
        time.sleep(0.2)


def start_serve(config_file: Path, env: dict[str, str], port: int,
                log: Path) -> subprocess.Popen[bytes]:
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


def write_config(folder: Path) -> Path:
    (folder / "runbooks").mkdir()
    (folder / "runbooks" / "busy.yaml").write_text(BUSY)
    raw = {"database_url": f"sqlite:///{folder / 'bot.db'}", "database": {"create": True},
           "runbook_paths": [str(folder / "runbooks")], "users": USERS,
           "requesters": ["group:oncall"], "approvers": ["group:gpu-leads"],
           "engine": {"poll_seconds": 0.2},
           "slack": {"channel": "C0RUNBOOK", "poll_seconds": 0.5,
                     "users": {"U0ALICE": "alice", "U0CAROL": "carol"}},
           "server": {"host": "127.0.0.1"}}
    config_file = folder / "bot.yaml"
    config_file.write_text(yaml.safe_dump(raw))
    return config_file


def one_level(slack: SlackClientSide, base: str, senders: int, requests: int,
              text: str) -> dict[str, Any]:
    """Floors, then the signed commands, at ``senders`` at once; then their answers."""
    livez = measure_floor(f"{base}/livez", senders, requests)
    healthz = measure_floor(f"{base}/healthz", senders, requests)
    bodies = [slack.command_body(text, "U0ALICE") for _ in range(requests)]
    urls = {urllib.parse.parse_qs(body)["response_url"][0] for body in bodies}
    load = os.getloadavg()[0]
    latencies = measure(slack, senders, bodies)
    got: dict[str, Any] = {**figures(latencies), "within_3s": sum(x < 3000 for x in latencies),
           "floor_livez": figures(livez), "floor_healthz": figures(healthz),
           "load_avg_1m": round(load, 2)}
    got["ratio_p99_to_livez_p99"] = round(got["p99_ms"] / got["floor_livez"]["p99_ms"], 2)
    got["answers"] = answered(slack.fake, urls)
    print(f"{senders:>2} at once: p50 {got['p50_ms']} ms, p99 {got['p99_ms']} ms, max "
          f"{got['max_ms']} ms over {requests} signed /runbook commands; floors p99: /livez "
          f"{got['floor_livez']['p99_ms']} ms, /healthz {got['floor_healthz']['p99_ms']} ms; "
          f"answered {got['answers']}; load {got['load_avg_1m']}")
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--running", type=int, default=4, help="executions running meanwhile")
    args = parser.parse_args()
    cleanup_on_signals()
    with tempfile.TemporaryDirectory() as tmp, standalone_fake(Path(tmp)) as (fake, secrets):
        folder = Path(tmp)
        config_file = write_config(folder)
        env = dict(os.environ, RUNBOOK_CONFIG=str(config_file), SLACK_BOT_TOKEN=secrets.bot_token,
                   SLACK_SIGNING_SECRET=secrets.signing_secret or "",
                   SLACK_API_URL=secrets.api_url or "")
        env.pop("SLACK_APP_TOKEN", None)
        port = free_port()
        serve = start_serve(config_file, env, port, folder / "serve.log")
        bot = Service.from_config(load_config(config_file))
        results: dict[str, Any] = {}
        try:
            base = f"http://127.0.0.1:{port}"
            slack = SlackClientSide(f"{base}/slack/events", secrets.signing_secret or "", fake)
            ids = [bot.request("bench-busy", {"n": str(n)}, "alice") for n in range(args.running)]
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and any(
                    bot.get(i).state != "running" for i in ids):
                time.sleep(0.1)
            running = sum(bot.get(i).state == "running" for i in ids)
            measure(slack, 4, [slack.command_body("help", "U0ALICE") for _ in range(40)])
            for senders in SENDERS:
                results[str(senders)] = one_level(slack, base, senders, args.requests,
                                                  f"status {ids[0]}")
            still = sum(bot.get(i).state == "running" for i in ids)
            for i in ids:
                bot.cancel(i, "alice")
        finally:
            serve.terminate()
            serve.wait(60)
    fifty = results["50"]
    goal = fifty["p99_ms"] < 50 and fifty["within_3s"] == args.requests
    correct = all(r["answers"]["once"] == args.requests for r in results.values())
    print(f"executions running meanwhile: {running} (still running at the end: {still}); "
          f"goal p99 < 50 ms at 50 senders: {'met' if goal else 'NOT met'}; every command "
          f"answered once: {correct}")
    finish("slack_ack", {"bench": "slack_ack", "running": running, "requests": args.requests,
                         "senders": results, "goal_p99_ms_at_50": 50, "goal_met": goal,
                         "every_command_answered_once": correct})


if __name__ == "__main__":
    main()
