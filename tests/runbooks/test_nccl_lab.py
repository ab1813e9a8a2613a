"""The shipped nccl-test runbook on two of the lab's real Slurm nodes, through srun with the
lab's fake all_reduce_perf (nccl-tests' output and NCCL's INFO lines): the first run records
the baseline of its shape and passes; `lab fault gpu02 nccl=slow` fails naming gpu02 with
both figures, `nccl=socket` fails naming gpu02 as falling back to sockets; cleared, it passes
against the baseline. A node running a job is refused without srun waiting for it. The
reservation is gone after every run and the nodes are in service."""

from __future__ import annotations

import time

import pytest

from bot.service import Service
from bot.store import audit
from tests.lab.fixture import Lab
from tests.runbooks.test_slurm_runbooks import (
    bot,
    node,
    reservations,
    resume_everything,
    run,
    start_job,
)

pytestmark = pytest.mark.lab
__all__ = ["bot"]  # the fixture, shared with the Slurm runbook tests

NODES = "gpu[01-02]"
RESERVATION = "nccl-gpu01-02"
KEY = "all_reduce_perf 2x8 NVIDIA H100 80GB HBM3 up to 1 GiB"


def nccl_test(lab: Lab, bot: Service, idle: tuple[str, ...] = ("gpu01", "gpu02")
              ) -> tuple[str, str]:
    """Run nccl-test on gpu[01-02]: (its final state, its error or its nccl step's summary);
    the reservation is gone and the ``idle`` nodes are in service, idle, afterwards."""
    ex = run(bot, "nccl-test", {"nodes": NODES}, approvers=())  # risk low: no approval
    assert f"ReservationName={RESERVATION} " not in reservations(lab)
    for name in idle:
        assert node(lab, name)["state"] == "IDLE", (name, node(lab, name))
    if ex.state != "succeeded":
        return ex.state, ex.error or ""
    with bot.db.connect() as conn:
        finished = [e for e in audit.events(conn, execution_id=ex.id)
                    if e["kind"] == "step_finished" and e["data"]["step"] == "nccl"]
    return ex.state, finished[0]["data"]["summary"]


def test_a_baseline_then_a_slow_and_a_socket_node_named_then_passing_again(
        lab: Lab, bot: Service) -> None:
    try:
        started = time.monotonic()
        state, said = nccl_test(lab, bot)
        assert state == "succeeded", said
        assert said.startswith("188.") and f"no baseline for {KEY} yet: this run's is " \
            "recorded as it" in said, said
        assert "across gpu[01-02] (IB/GDRDMA)" in said
        assert time.monotonic() - started < 60

        lab.lab("fault", "gpu02", "nccl=slow")
        state, said = nccl_test(lab, bot)
        assert state == "failed", said
        assert "step nccl failed" in said and "undone: reserve" in said, said
        assert "nccl-test failed on gpu[01-02]: bus bandwidth 49." in said, said
        assert "is 26% of the baseline 188." in said and "(at least 80% needed)" in said
        assert "likely gpu02 (IB ports slower than the others' 400 Gb/s: gpu02 100 Gb/s)" in said

        lab.lab("fault", "gpu02", "nccl=socket")
        state, said = nccl_test(lab, bot)
        assert state == "failed", said
        assert "gpu02 fell back to sockets (NET/IB : No device found, NCCL used NET/Socket)" \
            in said, said
        assert "gpu01 fell back" not in said

        lab.lab("fault", "gpu02", "clear")
        state, said = nccl_test(lab, bot)
        assert state == "succeeded", said
        assert ": 100% of the baseline 188." in said and KEY in said, said
    finally:
        resume_everything(lab, "gpu01", "gpu02")


def test_a_node_running_a_job_is_refused_and_the_job_left_alone(lab: Lab, bot: Service) -> None:
    job = start_job(lab, "gpu02")
    try:
        state, said = nccl_test(lab, bot, idle=("gpu01",))
        assert state == "failed", said
        assert f"jobs {job}" in said and "srun would wait for those jobs" in said, said
        assert "RUNNING" in lab.run("squeue", "-h", "-j", job, "-o", "%T").stdout
    finally:
        lab.run("scancel", job)
        resume_everything(lab, "gpu01", "gpu02")
