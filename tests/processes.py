"""Stopping a `runbook serve` (or any Python child) a test started, without leaking it.

A child started with ``FAULTHANDLER`` in its environment that does not exit in time after
SIGTERM is sent SIGABRT, so Python's faulthandler writes every thread's stack to its stderr;
the test then fails with that stack, and the child is gone either way.
"""

from __future__ import annotations

import signal
import subprocess

FAULTHANDLER = {"PYTHONFAULTHANDLER": "1"}  # SIGABRT -> every thread's stack on stderr


def stopped(proc: subprocess.Popen[str], seconds: float = 60) -> tuple[str, str]:
    """SIGTERM, then the child's stdout and stderr once it exited (each "" when not piped).
    AssertionError with its threads' stacks when it is still running ``seconds`` later."""
    proc.terminate()
    try:
        out, err = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        stacks = (err or "")[-6000:]
        raise AssertionError(f"{proc.args!r} was still running {seconds:g}s after SIGTERM; "
                             f"its stderr, with its threads' stacks:\n{stacks}") from None
    return out or "", err or ""
