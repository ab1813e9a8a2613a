"""Cancel to undone: a drain-node waiting for a training job (the wait-idle step) is
cancelled; how long until the node is back in service in Slurm, and until the execution
has ended ``cancelled``. Median of ``--runs`` (default 5), the job left running each time.

The baseline, measured in the same run, is the floor a person at a terminal has: from
typing ``scontrol update NodeName=N State=RESUME`` on a drained node to Slurm showing it
out of DRAIN. The bot's figure includes noticing the cancel, stopping the waiting
step, recording it, and running the undo (that same scontrol).

Needs a running lab: `deploy/lab/lab up && eval "$(deploy/lab/lab env)"`. Starts from a clean
lab (`lab reset`, else its own leftovers: the job named grb-bench-cancel-hold, gpu02 drained)
and leaves it so, also on failure, Ctrl-C or SIGTERM (a running execution is cancelled).
Goal: at most 5 s. It never asserts a time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchkit import cleanup_on_signals, finish  # bench/, next to this file
from labclean import clean, reset_lab

from bot.config import EngineConfig, load_config
from bot.execution.engine import Engine
from bot.service import Service
from bot.store import audit

GOAL_SECONDS = 5.0
NODE = "gpu02"
JOB = "grb-bench-cancel-hold"  # found by name when a run failed or was stopped
LIVE: list[tuple[Service, int]] = []  # the execution being measured, cancelled on failure


def slurm(*argv: str) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True, check=False,
                          timeout=60).stdout


def drained() -> bool:
    return "DRAIN" in slurm("scontrol", "show", "node", NODE, "-o")


def wait(condition: object, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit("timed out waiting in the benchmark")
        time.sleep(0.02)


def start_job() -> str:
    job = slurm("sbatch", "--parsable", "-o", "/dev/null", "-w", NODE, "-N1", "-J",
                JOB, "--wrap", "sleep 600").strip()
    wait(lambda: "RUNNING" in slurm("squeue", "-h", "-j", job, "-o", "%T"))
    return job


def one_cancel(bot: Service) -> tuple[float, float]:
    execution_id = bot.request("drain-node", {"node": NODE, "reason": "bench"}, "alice")
    LIVE[:] = [(bot, execution_id)]
    if bot.get(execution_id).state == "awaiting_approval":
        bot.approve(execution_id, "carol")
    engine = Engine(bot)
    worker = threading.Thread(target=engine.drive, args=(execution_id,), daemon=True)
    worker.start()

    def waiting() -> bool:
        with bot.db.connect() as conn:
            return any(e["kind"] == "step_started" and e["data"].get("step") == "wait-idle"
                       for e in audit.events(conn, execution_id=execution_id))

    wait(waiting)
    time.sleep(1.0)  # well inside the wait
    asked = time.perf_counter()
    bot.cancel(execution_id, "alice")
    wait(lambda: not drained(), 60)
    back = time.perf_counter() - asked
    worker.join(60)
    ended = time.perf_counter() - asked
    engine.close()
    LIVE.clear()
    state = bot.get(execution_id).state
    if state != "cancelled":
        raise SystemExit(f"execution {execution_id} ended {state}, not cancelled")
    return back, ended


def baseline() -> float:
    slurm("scontrol", "update", f"NodeName={NODE}", "State=DRAIN", "Reason=bench baseline")
    wait(drained)
    asked = time.perf_counter()
    slurm("scontrol", "update", f"NodeName={NODE}", "State=RESUME")
    wait(lambda: not drained())
    return time.perf_counter() - asked


def stop_live() -> None:
    """Cancel the execution a failed run left (its undo resumes the node) and wait for it."""
    for bot, execution_id in LIVE:
        if not bot.get(execution_id).terminal:
            bot.cancel(execution_id, "alice")
            wait(lambda: bot.get(execution_id).terminal, 60)  # noqa: B023 - one at a time
    LIVE.clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if not os.environ.get("RUNBOOK_CONFIG"):
        sys.exit("needs the lab: deploy/lab/lab up && eval \"$(deploy/lab/lab env)\"")
    cleanup_on_signals()
    env = dict(os.environ)
    if not reset_lab(env):
        clean(env, JOB, [NODE])
    with tempfile.TemporaryDirectory(prefix="bench-cancel-") as folder:
        config = load_config().model_copy(update={
            "database_url": f"sqlite:///{Path(folder) / 'bot.db'}",
            "engine": EngineConfig(lease_seconds=10, poll_seconds=0.1),
        })
        bot = Service.from_config(config)
        try:
            job = start_job()
            floor = [baseline() for _ in range(args.runs)]
            runs = [one_cancel(bot) for _ in range(args.runs)]
            still = "RUNNING" in slurm("squeue", "-h", "-j", job, "-o", "%T")
        finally:
            try:
                stop_live()
            finally:
                clean(env, JOB, [NODE])
                bot.db.dispose()
    back = statistics.median(r[0] for r in runs)
    ended = statistics.median(r[1] for r in runs)
    base = statistics.median(floor)
    print(f"cancel -> {NODE} out of DRAIN: median {back:.2f}s over {args.runs} runs "
          f"(each: {', '.join(f'{r[0]:.2f}' for r in runs)})")
    print(f"cancel -> execution ended cancelled: median {ended:.2f}s")
    print(f"baseline, scontrol resume by hand -> out of DRAIN: median {base:.2f}s; "
          f"the bot takes {back / base:.1f}x the floor")
    print(f"the job was {'still running' if still else 'NOT running'} after every cancel")
    print(f"goal <= {GOAL_SECONDS:g}s: {'met' if back <= GOAL_SECONDS else 'NOT met'}")
    finish("cancel_to_undone", {
        "cancel_to_undone_s": round(back, 3), "cancel_to_ended_s": round(ended, 3),
        "baseline_resume_s": round(base, 3), "ratio": round(back / base, 2),
        "job_untouched": still, "goal_met": back <= GOAL_SECONDS})


if __name__ == "__main__":
    main()
