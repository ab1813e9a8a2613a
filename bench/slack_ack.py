"""Slack slash-command acknowledgement latency: p50 and p99 with 1 and with 20 concurrent
senders, while executions run (each waits in a step; the progress poster is live).

The bot runs `serve` in this process with the Slack surface in HTTP mode against the lab's
fake of Slack's Web API; requests are signed exactly as Slack signs them. Latency is from
sending the request to the HTTP answer (the ack). Goal: p99 < 100 ms (Slack allows 3,000 ms).

Needs a running lab: `deploy/lab/lab up && eval "$(deploy/lab/lab env)"`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.chat.slack.secrets import SlackSecrets
from bot.config import EngineConfig, load_config
from bot.service import Bot
from tests.bot.chat.slackhelp import SlackClientSide, serving

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
        status, _, elapsed = slack.command(text, "U0ALICE")
        if status != 200:
            raise SystemExit(f"the bot answered {status}")
        return elapsed * 1000

    with ThreadPoolExecutor(senders) as pool:
        return list(pool.map(one, range(requests)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--running", type=int, default=4, help="executions running meanwhile")
    args = parser.parse_args()
    if not os.environ.get("SLACK_SIGNING_SECRET") or not os.environ.get("RUNBOOK_CONFIG"):
        sys.exit("needs the lab: deploy/lab/lab up && eval \"$(deploy/lab/lab env)\"")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "busy.yaml").write_text(BUSY)
        config = load_config()
        config = config.model_copy(update={
            "database_url": f"sqlite:///{folder / 'bot.db'}",
            "engine": EngineConfig(poll_seconds=0.2),
            "runbook_paths": [*config.runbook_paths, folder]})
        bot = Bot.from_config(config)
        secrets = SlackSecrets(bot_token=os.environ["SLACK_BOT_TOKEN"],
                               signing_secret=os.environ["SLACK_SIGNING_SECRET"], app_token=None,
                               api_url=os.environ["SLACK_API_URL"], mode="http")
        with serving(bot, secrets) as (_, base):
            slack = SlackClientSide(base + "/slack/events", secrets.signing_secret or "",
                                    os.environ["SLACK_API_URL"].rsplit("/api", 1)[0]
                                    + "/_lab/response")
            ids = [bot.request("bench-busy", {"n": str(n)}, "alice") for n in range(args.running)]
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and any(
                    bot.get(i).state != "running" for i in ids):
                time.sleep(0.1)
            running = sum(bot.get(i).state == "running" for i in ids)
            measure(slack, 4, 40, "help")  # warm up
            results = {}
            for senders in (1, 20):
                latencies = measure(slack, senders, args.requests, f"status {ids[0]}")
                results[senders] = {"p50_ms": round(statistics.median(latencies), 2),
                                    "p99_ms": round(percentile(latencies, 0.99), 2),
                                    "max_ms": round(max(latencies), 2)}
                print(f"{senders:>2} concurrent: p50 {results[senders]['p50_ms']} ms, "
                      f"p99 {results[senders]['p99_ms']} ms, max {results[senders]['max_ms']} "
                      f"ms over {args.requests} signed /runbook commands")
            for i in ids:
                bot.cancel(i, "alice")
            goal = all(r["p99_ms"] < 100 for r in results.values())
            print(f"executions running meanwhile: {running}; goal p99 < 100 ms: "
                  f"{'met' if goal else 'NOT met'}")
            print(json.dumps({"bench": "slack_ack", "running": running,
                              "one": results[1], "twenty": results[20], "goal_met": goal}))


if __name__ == "__main__":
    main()
