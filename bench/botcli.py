"""A runbook driven end to end through the product's command line, as an on-call engineer
does: `runbook run NAME k=v... --wait --as alice` (request, plan, then it drives the steps),
`runbook approve ID --as carol` from a second process while the first waits, until the
first exits. Timed from the start of `runbook run` to its exit. On any failure or signal the
execution is cancelled (its undo runs) and the processes are stopped."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

RUNBOOK = [str(Path(sys.executable).with_name("runbook"))]


@dataclass
class BotRun:
    """One `runbook run --wait` through the CLI."""

    runbook: str
    execution_id: int | None = None
    began_at: float = 0.0  # wall clock (time.time) when `runbook run` started
    seconds: float = 0.0  # `runbook run` start to exit
    until_approved: float = 0.0  # `runbook run` start to the last approval answered
    exit_code: int | None = None
    awaited_approval: bool = False
    output: list[str] = field(default_factory=list)

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0 and any(": succeeded" in line for line in self.output)


def cli(env: dict[str, str], *args: str, timeout: float = 120,
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RUNBOOK, *args], env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout, check=False)


def _read(process: subprocess.Popen[str], run: BotRun, asked: threading.Event) -> None:
    """Collect the output; ``asked`` is set when the run waits for approval (or ended)."""
    assert process.stdout is not None
    for line in process.stdout:
        run.output.append(line.rstrip("\n"))
        found = re.fullmatch(r"execution (\d+)", line.strip())
        if found and run.execution_id is None:
            run.execution_id = int(found.group(1))
        if line.startswith("awaiting approval"):
            run.awaited_approval = True
            asked.set()
    asked.set()


def _approve(env: dict[str, str], run: BotRun, approvers: tuple[str, ...]) -> None:
    assert run.execution_id is not None
    for approver in approvers:
        done = cli(env, "approve", str(run.execution_id), "--as", approver)
        if done.returncode != 0:
            raise RuntimeError(f"runbook approve {run.execution_id} --as {approver}: "
                               f"{done.stderr.strip() or done.stdout.strip()}")


def run_approved(env: dict[str, str], runbook: str, params: list[str],
                 approvers: tuple[str, ...] = ("carol",), requester: str = "alice",
                 extra: tuple[str, ...] = (), timeout: float = 900) -> BotRun:
    """`runbook run RUNBOOK PARAMS --wait --as REQUESTER`, approved by each of ``approvers``
    once it asks (none for a runbook that needs no approval)."""
    run = BotRun(runbook)
    asked = threading.Event()
    began, run.began_at = time.perf_counter(), time.time()
    process = subprocess.Popen(
        [*RUNBOOK, "run", runbook, *params, "--wait", "--as", requester, *extra],
        env=dict(env, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    reader = threading.Thread(target=_read, args=(process, run, asked), daemon=True)
    reader.start()
    try:
        if approvers:
            asked.wait(timeout)
            if run.awaited_approval:
                _approve(env, run, approvers)
        run.until_approved = time.perf_counter() - began
        run.exit_code = process.wait(timeout)
        run.seconds = time.perf_counter() - began
        reader.join(10)
        return run
    finally:
        if process.poll() is None:
            stop(env, run, process)


def stop(env: dict[str, str], run: BotRun, process: subprocess.Popen[str]) -> None:
    """Cancel the execution (its completed steps are undone), then stop `runbook run`."""
    if run.execution_id is not None:
        cli(env, "cancel", str(run.execution_id), "--as", "alice", timeout=60)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(60)  # the undo runs in that process: let it finish
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def phases(env: dict[str, str], run: BotRun) -> dict[str, float]:
    """Where a run's time went, from its audit log (seconds): `runbook run` started to the
    request recorded (the process starting, the configuration, the pools listed, the plan);
    then to the plan recorded, approved, the engine starting it, the end; the engine's run
    (start to end) and each step (by id); the end to `runbook run` exiting."""
    assert run.execution_id is not None
    from datetime import datetime

    from bot.config import load_config
    from bot.store import audit, db

    engine = db.connect(load_config(env["RUNBOOK_CONFIG"]).resolved_database_url())
    try:
        with engine.connect() as conn:
            found = list(audit.events(conn, execution_id=run.execution_id))
    finally:
        engine.dispose()
    at: dict[str, float] = {}
    steps: dict[str, float] = {}
    for event in found:
        ts = datetime.fromisoformat(event["ts"]).timestamp()
        at.setdefault(event["kind"], ts)
        at[f"last_{event['kind']}"] = ts
        step = event["data"].get("step")
        if event["kind"] == "step_started" and step:
            steps[step] = -ts
        elif event["kind"] in ("step_finished", "step_failed") and step in steps:
            steps[step] += ts
    start = at.get("requested", 0.0)
    figures = {"cli_start_to_requested": round(start - run.began_at, 3)}
    figures.update({f"to_{kind}": round(at[kind] - start, 3)
                    for kind in ("planned", "approved", "started", "finished") if kind in at})
    if "started" in at and "finished" in at:
        figures["engine_run"] = round(at["finished"] - at["started"], 3)
        figures["finished_to_exit"] = round(run.began_at + run.seconds - at["finished"], 3)
    figures.update({f"step_{name}": round(seconds, 3) for name, seconds in steps.items()})
    return figures
