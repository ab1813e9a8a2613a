"""The shared lab, as benchmarks that use it find and leave it: a clean start (`lab reset`
where the lab has it, else this benchmark's own leftovers: its Slurm jobs, found by their
name, and the nodes it drains), and the same cleanup at the end, on failure too."""

from __future__ import annotations

import subprocess
from pathlib import Path

LAB = Path(__file__).resolve().parent.parent / "deploy" / "lab" / "lab"
JOB_PREFIX = "grb-bench-"  # every Slurm job a benchmark submits is named so


def _run(env: dict[str, str], *argv: str, timeout: float = 60,
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout, check=False)


def reset_lab(env: dict[str, str]) -> bool:
    """`lab reset`: the running lab back to its state after `lab up`. False where this lab
    has no reset command (or it failed): then the caller cleans what it made itself."""
    done = _run(env, str(LAB), "reset", timeout=300)
    if done.returncode != 0:
        print(f"lab reset unavailable or failed (exit {done.returncode}): "
              f"{(done.stderr or done.stdout).strip()[-300:]}")
    return done.returncode == 0


def cancel_jobs(env: dict[str, str], name: str) -> list[str]:
    """scancel every job named ``name`` (leftovers of an earlier run too); their ids."""
    if not name.startswith(JOB_PREFIX):
        raise ValueError(f"benchmark jobs are named {JOB_PREFIX}...: {name!r}")
    ids = _run(env, "squeue", "-h", "-n", name, "-o", "%i").stdout.split()
    if ids:
        _run(env, "scancel", *ids)
    return ids


def resume_nodes(env: dict[str, str], nodes: list[str]) -> None:
    """Take ``nodes`` out of DRAIN (Slurm answers an error for a node not drained: ignored)."""
    for node in nodes:
        _run(env, "scontrol", "update", f"NodeName={node}", "State=RESUME")


def clean(env: dict[str, str], job_name: str, nodes: list[str]) -> None:
    """This benchmark's jobs cancelled and its nodes resumed."""
    cancelled = cancel_jobs(env, job_name)
    resume_nodes(env, nodes)
    if cancelled:
        print(f"cancelled jobs {', '.join(cancelled)} ({job_name})")
