"""tests/processes.py: a child that ignores SIGTERM fails the test with its stack, and is gone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.processes import FAULTHANDLER, stopped

SLEEPS = "print('up', flush=True); time.sleep(600)"
HANGS = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + SLEEPS


def test_a_child_that_ignores_sigterm_fails_with_its_stack_and_is_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", HANGS], env={**os.environ, **FAULTHANDLER},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "up\n"
    with pytest.raises(AssertionError) as failed:
        stopped(child, seconds=1)
    assert "still running 1s after SIGTERM" in str(failed.value)
    assert "time.sleep" in str(failed.value) or "<string>" in str(failed.value)  # its stack
    assert child.poll() is not None


def test_a_child_that_stops_gives_its_output() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; " + SLEEPS],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "up\n"
    assert stopped(child) == ("", "")
    assert child.returncode == -15
