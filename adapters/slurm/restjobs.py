"""``run_on_node`` over slurmrestd: the command as a batch job pinned to the node (inside its
maintenance reservation), judged by its exit code through the job API. The script is fixed,
``exec "$@"``, and the command is the job's ``argv``: no word of it is read by a shell.
slurmrestd returns no output, so the job writes it to ``slurm.rest.job_output_dir`` (shared
by the nodes and the bot) under unguessable names; the bot reads and removes them. The job's
time limit is the command's timeout, so Slurm ends it even if the bot dies.
"""

from __future__ import annotations

import contextlib
import math
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adapters.slurm import parsing
from adapters.slurm.backend import SlurmError
from adapters.slurm.restclient import RestClient

SCRIPT = '#!/bin/sh\nexec "$@"\n'  # the command arrives as "$@": quoted by the shell itself
JOB_NAME = "gpu-runbook-bot"
# The job gets these and the command's env:, never the bot's own environment.
NODE_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BASE_ENVIRONMENT = (NODE_PATH, "LANG=C.UTF-8")
ENDED = {"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE", "PREEMPTED", "SPECIAL_EXIT"}
OUTPUT_TAIL = 1 << 20  # bytes of each output file the bot reads (its end)


@dataclass(frozen=True)
class JobOutcome:
    job_id: int
    states: frozenset[str]
    exit_code: int


def job_body(node: str, reservation: str | None, argv: list[str], timeout: float,
             env: Mapping[str, str], output: Path) -> dict[str, Any]:
    """The /job/submit body (v0.0.40 to v0.0.45 read it alike)."""
    job: dict[str, Any] = {
        "name": JOB_NAME,
        "argv": [JOB_NAME, *argv],  # argv[0] is the script's $0, as sbatch passes it
        "required_nodes": [node],
        "minimum_nodes": 1, "maximum_nodes": 1, "tasks": 1,
        "current_working_directory": "/",
        "environment": [*BASE_ENVIRONMENT, *(f"{k}={v}" for k, v in sorted(env.items()))],
        "standard_output": str(output.with_suffix(".out")),
        "standard_error": str(output.with_suffix(".err")),
        "time_limit": {"set": True, "number": max(1, math.ceil(timeout / 60))},  # minutes
        "requeue": False,
    }
    if reservation:
        job["reservation"] = reservation
    return {"script": SCRIPT, "job": job}


class NodeJob:
    """One command run on one node as a batch job: submit, wait, read its output, tidy up."""

    def __init__(self, client: RestClient, output_dir: str,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.client = client
        self.output_dir = Path(output_dir)
        self.clock = clock
        self.sleep = sleep

    def run(self, node: str, reservation: str | None, argv: list[str], timeout: float,
            env: Mapping[str, str]) -> tuple[int, str, str]:
        stem = self.output_dir / f"{JOB_NAME}-{secrets.token_hex(12)}"
        body = job_body(node, reservation, argv, timeout, env, stem)
        try:
            job_id = self._submit(body)
            outcome = self._wait(job_id, node, timeout)
            out, err = _tail(stem.with_suffix(".out")), _tail(stem.with_suffix(".err"))
            if out is None and outcome.states & {"COMPLETED", "FAILED"}:
                raise SlurmError(
                    f"job {job_id} ran on {node} (exit {outcome.exit_code}) but its output "
                    f"is not in {self.output_dir}: slurm.rest.job_output_dir must be a folder "
                    "the nodes write and the bot reads (a shared filesystem)")
            return outcome.exit_code, out or "", err or ""
        finally:
            for path in (stem.with_suffix(".out"), stem.with_suffix(".err")):
                with contextlib.suppress(OSError):
                    path.unlink()

    def _submit(self, body: Mapping[str, Any]) -> int:
        answer = self.client.request("POST", "/slurm/{v}/job/submit", body=body)
        job_id = parsing.integer(answer.get("job_id"))
        if not job_id:
            raise SlurmError("slurmrestd accepted the batch job but named no job id: "
                             "its state is unknown; look for jobs named " + JOB_NAME)
        return job_id

    def _wait(self, job_id: int, node: str, timeout: float) -> JobOutcome:
        deadline = self.clock() + timeout
        pause = 0.2
        while True:
            outcome = self._read(job_id)
            if outcome is not None:
                return outcome
            if self.clock() >= deadline:
                self._cancel(job_id)
                raise SlurmError(f"job {job_id} on {node} did not finish within {timeout:g}s; "
                                 "cancelled (pending: is the node drained or outside the "
                                 "reservation?)")
            self.sleep(min(pause, max(0.0, deadline - self.clock())))
            pause = min(pause * 2, 2.0)

    def _read(self, job_id: int) -> JobOutcome | None:
        """The job's outcome once it has ended; None while it waits, runs or completes."""
        answer = self.client.get(f"/slurm/{{v}}/job/{job_id}")
        (job,) = answer.get("jobs") or [None]
        if not isinstance(job, Mapping):
            raise SlurmError(f"slurmrestd has no record of job {job_id}")
        states = frozenset(parsing.states(job.get("job_state")))
        if "COMPLETING" in states or not states & ENDED:
            return None
        return JobOutcome(job_id, states, exit_status(job.get("exit_code"), states))

    def _cancel(self, job_id: int) -> None:
        with contextlib.suppress(SlurmError):  # the timeout is the error to report
            self.client.request("DELETE", f"/slurm/{{v}}/job/{job_id}")


def exit_status(value: Any, states: frozenset[str]) -> int:
    """A shell's exit status: the return code, 128 + the signal that killed the command, and
    never 0 for a job Slurm did not complete (a timeout, a failed node)."""
    code = 0
    signal = 0
    if isinstance(value, Mapping):
        code = parsing.integer(value.get("return_code")) or 0
        sig = value.get("signal")
        signal = (parsing.integer(sig.get("id")) or 0) if isinstance(sig, Mapping) else 0
    elif value is not None:  # the raw wait status (older answers)
        raw = parsing.integer(value) or 0
        code, signal = raw >> 8, raw & 0x7F
    if signal:
        return 128 + signal
    if code == 0 and states != {"COMPLETED"}:
        return 1  # ended without completing, yet no code: never a pass
    return code


def _tail(path: Path) -> str | None:
    """The end of an output file; None when the job never wrote it where the bot looks."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(0, handle.tell() - OUTPUT_TAIL))
            return handle.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return None
