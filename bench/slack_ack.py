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


def server_buckets(base: str, route: str) -> dict[float, float]:
    """runbook_http_request_duration_seconds of ``route`` (status 200) from /metrics: how
    many answers took at most each bucket's seconds inside the server's application."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (sample.name.endswith("_bucket") and sample.labels.get("route") == route
                    and sample.labels.get("code") == "200"):
                found[float(sample.labels["le"])] = sample.value
    return found


def inside_server(before: dict[float, float], after: dict[float, float]) -> dict[str, float]:
    """The share of the answers counted between two reads within 5, 10 and 50 ms."""
    total = after.get(float("inf"), 0) - before.get(float("inf"), 0)
    return {f"within_{round(le * 1000)}ms": round((after.get(le, 0) - before.get(le, 0))
                                                  / total, 3) if total else 0.0
            for le in (0.005, 0.01, 0.05)}


def cpu_seconds(pid: int) -> float:
    """User and system CPU time a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_level(slack: SlackClientSide, base: str, serve: int, senders: int, requests: int,
              text: str, rounds: int) -> dict[str, Any]:
    """``rounds`` rounds of: the floors, then signed commands, ``senders`` at once, then
    their answers awaited. Interleaved, so that the machine's load (shared, busy) weighs on
    the floors and the commands alike."""
    livez: list[float] = []
    healthz: list[float] = []
    latencies: list[float] = []
    answers = {"none": 0, "once": 0, "more": 0}
    cpu, loads, inside = 0.0, [], []
    for _ in range(rounds):
        livez += measure_floor(f"{base}/livez", senders, requests // rounds)
        healthz += measure_floor(f"{base}/healthz", senders, requests // rounds)
        bodies = [slack.command_body(text, "U0ALICE") for _ in range(requests // rounds)]
        urls = {urllib.parse.parse_qs(body)["response_url"][0] for body in bodies}
        loads.append(os.getloadavg()[0])
        before, buckets = cpu_seconds(serve), server_buckets(base, "/slack/events")
        latencies += measure(slack, senders, bodies)
        inside.append(inside_server(buckets, server_buckets(base, "/slack/events")))
        for key, count in answered(slack.fake, urls).items():
            answers[key] += count
        cpu += cpu_seconds(serve) - before
    got: dict[str, Any] = {**figures(latencies), "within_3s": sum(x < 3000 for x in latencies),
                           "floor_livez": figures(livez), "floor_healthz": figures(healthz),
                           "load_avg_1m": round(statistics.mean(loads), 2),
                           "serve_cpu_ms_per_command": round(cpu * 1000 / len(latencies), 2),
                           "answers": answers,
                           "acks_inside_the_server": {key: round(statistics.mean(
                               share[key] for share in inside), 3) for key in inside[0]}}
    got["ratio_p99_to_livez_p99"] = round(got["p99_ms"] / got["floor_livez"]["p99_ms"], 2)
    print(f"{senders:>2} at once: p50 {got['p50_ms']} ms, p99 {got['p99_ms']} ms, max "
          f"{got['max_ms']} ms over {len(latencies)} signed /runbook commands; floors p99: "
          f"/livez {got['floor_livez']['p99_ms']} ms, /healthz {got['floor_healthz']['p99_ms']}"
          f" ms; ratio {got['ratio_p99_to_livez_p99']}; serve CPU "
          f"{got['serve_cpu_ms_per_command']} ms a command; inside the server "
          f"{got['acks_inside_the_server']}; answered {answers}; load "
          f"{got['load_avg_1m']}")
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--running", type=int, default=4, help="executions running meanwhile")
    parser.add_argument("--rounds", type=int, default=4, help="floor and commands alternate")
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
                results[str(senders)] = one_level(slack, base, serve.pid, senders,
                                                  args.requests, f"status {ids[0]}",
                                                  args.rounds)
            still = sum(bot.get(i).state == "running" for i in ids)
            for i in ids:
                bot.cancel(i, "alice")
        finally:
            serve.terminate()
            serve.wait(60)
    fifty = results["50"]
    sent = args.requests // args.rounds * args.rounds
    goal = fifty["p99_ms"] < 50 and fifty["within_3s"] == sent
    correct = all(r["answers"] == {"none": 0, "once": sent, "more": 0} for r in results.values())
    print(f"executions running meanwhile: {running} (still running at the end: {still}); "
          f"goal p99 < 50 ms at 50 senders: {'met' if goal else 'NOT met'}; every command "
          f"answered once: {correct}")
    finish("slack_ack", {"bench": "slack_ack", "running": running, "requests": args.requests,
                         "senders": results, "goal_p99_ms_at_50": 50, "goal_met": goal,
                         "every_command_answered_once": correct})


if __name__ == "__main__":
    main()
