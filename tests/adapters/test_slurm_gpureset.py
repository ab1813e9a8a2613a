"""``slurm.gpu_reset`` over the in-memory Slurm fake with a fake clock (no lab): its
arguments, the lines of its plan, the order of the fallback (reset, then reboot, then the
node left drained), which method worked, a reboot that never comes back, and a stop that
never falls back."""

from __future__ import annotations

import time
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from adapters.actions import ActionContext, ActionError, ActionStopped
from adapters.host import HostCommand
from adapters.slurm import actions as slurm_actions
from adapters.slurm import gpureset
from adapters.slurm.config import SlurmConfig
from adapters.slurm.fake import FakeSlurm
from adapters.slurm.gpureset import GpuResetAction, GpuResetArguments
from tests.adapters.test_gpu_gate import Dcgm

COMMANDS = {
    "health-check": HostCommand(argv=["dcgmi", "diag", "-r", "2"]),
    "gpu-persistence-off": HostCommand(argv=["nvidia-smi", "-pm", "0", "-i"], accepts_args=True),
    "gpu-reset": HostCommand(argv=["nvidia-smi", "-r", "-i"], accepts_args=True),
}
ENV = "--export=PATH,HOME,USER,LOGNAME,LANG,LC_ALL,TZ"


class Clock:
    """Monotonic time that moves only when the action sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.05)


class Node(FakeSlurm):
    """A fake whose reboot takes ``reboot_polls`` reads (or never ends) and resumes the node,
    and whose programs fail as told: ``reset_fails``, ``health_fails`` (how many checks)."""

    def __init__(self, reset_fails: bool = False, health_fails: int = 0,
                 reboot_polls: int | None = 2) -> None:
        super().__init__(["gpu03", "gpu04"])
        self.reset_fails, self.health_fails, self.reboot_polls = reset_fails, health_fails, \
            reboot_polls
        self.rebooting: int | None = None
        # drained by the runbook's own drain step (execution 1: the context's)
        self.state["gpu03"] = replace(self.state["gpu03"], flags=frozenset({"DRAIN"}),
                                      reason="reset GPU 3: XID 48 (execution 1)",
                                      boot_time=100)
        self.create_reservation("reset-gpu03", ["gpu03"], "now", 3600, ["MAINT"], ["root"])
        self.calls.clear()

    def nodes(self, names: list[str] | None = None, *, with_jobs: bool = True) -> list[Any]:
        if self.rebooting is not None and self.reboot_polls is not None:
            self.rebooting += 1
            if self.rebooting >= self.reboot_polls:
                node = self.state["gpu03"]
                self.state["gpu03"] = replace(node, flags=frozenset(), boot_time=200)
                self.rebooting = None
        return super().nodes(names, with_jobs=with_jobs)

    def reboot(self, names: list[str], nextstate: str, reason: str) -> None:
        super().reboot(names, nextstate, reason)
        node = self.state["gpu03"]
        self.state["gpu03"] = replace(node, flags=node.flags | {"DRAIN", "REBOOT_REQUESTED"})
        self.rebooting = 0

    def run_on_node(self, node: str, reservation: str | None, argv: list[str],
                    timeout: float, env: Any = None) -> tuple[int, str, str]:
        super().run_on_node(node, reservation, argv, timeout, env)
        if argv[:2] == ["nvidia-smi", "-r"] and self.reset_fails:
            return 255, "", "Unable to reset this GPU because it's being used by some other " \
                "process\nsrun: error: task 0: Exited with exit code 255\n"
        if argv[0] == "dcgmi" and self.health_fails:
            self.health_fails -= 1
            return 1, "| GPU Memory | Fail - GPU: 3 |\n", "srun: error: task 0: exit 1\n"
        return 0, "All done.\n", ""


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    for module in (gpureset, slurm_actions):
        monkeypatch.setattr(module, "time", SimpleNamespace(monotonic=fake.monotonic))
    return fake


def action(backend: FakeSlurm, clock: Clock) -> GpuResetAction:
    return GpuResetAction(backend, SlurmConfig(commands=COMMANDS), sleep=clock.sleep)


def arguments(**given: Any) -> GpuResetArguments:
    values = {"node": "gpu03", "gpu": 3, "reservation": "reset-gpu03", "reason": "XID 48",
              **given}
    return GpuResetArguments.model_validate(values)


def context() -> ActionContext:
    return ActionContext(execution_id=1, step_id="reset", deadline=time.monotonic() + 3600)


def programs(backend: FakeSlurm) -> list[str]:
    return [" ".join(call[3]) for call in backend.calls if call[0] == "srun"]


def test_arguments_are_validated() -> None:
    for bad in ({"gpu": 16}, {"gpu": -1}, {"method": "powercycle"}, {"node": "gpu03;id"},
                {"reason": "two\nlines"}, {"reason": ""}, {"extra": 1}):
        with pytest.raises(ValidationError):
            arguments(**bad)
    assert arguments(gpu="7").gpu == 7  # a rendered template is text


def test_plan_shows_every_line_and_the_fallback(clock: Clock) -> None:
    srun = f"srun -w gpu03 -N1 -n1 {ENV} --reservation=reset-gpu03 --"
    assert action(Node(), clock).plan(arguments()) == [
        "scontrol update NodeName=gpu03 State=RESUME (inside reservation reset-gpu03: no "
        "other job lands there)",
        f"{srun} nvidia-smi -pm 0 -i 3",
        f"{srun} nvidia-smi -r -i 3",
        f"{srun} dcgmi diag -r 2",
        'if the reset fails: scontrol reboot ASAP nextstate=RESUME reason="GPU 3 reset '
        'failed: XID 48" gpu03',
        "if the reset fails: wait until gpu03 rebooted and responds (at most 15m)",
        f"if the reset fails: {srun} dcgmi diag -r 2",
        'if the reboot fails too: scontrol update NodeName=gpu03 State=DRAIN Reason="GPU 3: '
        'reset and reboot did not clear it: ..."; scontrol delete ReservationName=reset-gpu03',
    ]
    reboot = action(Node(), clock).plan(arguments(method="reboot"))
    assert not any("nvidia-smi" in line or "if the reset" in line for line in reboot)
    assert reboot[1].startswith("scontrol reboot ASAP nextstate=RESUME")
    assert reboot[-1].startswith("if it fails: scontrol update NodeName=gpu03 State=DRAIN")


def test_plan_refuses_a_node_outside_slurm_and_commands_not_allow_listed(clock: Clock) -> None:
    with pytest.raises(ActionError, match=r"gpu06 is not in the Slurm pool: .*srun"):
        action(Node(), clock).plan(arguments(node="gpu06", in_slurm=False))
    bare = GpuResetAction(Node(), SlurmConfig(commands={"health-check": COMMANDS[
        "health-check"]}), sleep=clock.sleep)
    with pytest.raises(ActionError, match='"gpu-persistence-off" is not allow-listed'):
        bare.plan(arguments())
    backend = Node()
    with pytest.raises(ActionError, match="not allow-listed"):
        bare.run(arguments(), context())
    assert backend.calls == []


def test_reset_works(clock: Clock) -> None:
    backend = Node()
    result = action(backend, clock).run(arguments(), context())
    assert result.details["method"] == "reset" and result.details["asked"] == "reset"
    assert "reset, health check passed" in result.summary
    assert programs(backend) == ["nvidia-smi -pm 0 -i 3", "nvidia-smi -r -i 3",
                                 "dcgmi diag -r 2"]
    assert ("update", ["gpu03"], "RESUME", None) in backend.calls
    assert not [c for c in backend.calls if c[0] == "reboot"]


def test_a_failed_reset_falls_back_to_a_reboot(clock: Clock) -> None:
    backend = Node(reset_fails=True)
    result = action(backend, clock).run(arguments(), context())
    assert result.details["method"] == "reboot"
    assert [a["method"] for a in result.details["attempts"]] == ["reset", "reboot"]
    assert "Unable to reset this GPU" in result.details["attempts"][0]["error"]
    assert programs(backend) == ["nvidia-smi -pm 0 -i 3", "nvidia-smi -r -i 3",
                                 "dcgmi diag -r 2"]
    kinds = [c[0] for c in backend.calls]
    assert kinds.index("reboot") > next(i for i, c in enumerate(backend.calls)
                                        if c[0] == "srun" and c[3][:2] == ["nvidia-smi", "-r"])
    assert ("reboot", ["gpu03"], "RESUME", "GPU 3 reset failed: XID 48") in backend.calls
    assert backend.state["gpu03"].flags == frozenset()


def test_a_failed_health_check_after_the_reset_reboots_too(clock: Clock) -> None:
    backend = Node(health_fails=1)
    result = action(backend, clock).run(arguments(), context())
    assert result.details["method"] == "reboot"
    assert programs(backend).count("dcgmi diag -r 2") == 2


def test_method_reboot_skips_the_reset(clock: Clock) -> None:
    backend = Node()
    result = action(backend, clock).run(arguments(method="reboot"), context())
    assert result.details["method"] == "reboot" and result.details["asked"] == "reboot"
    assert programs(backend) == ["dcgmi diag -r 2"]


def test_reset_and_reboot_failing_leave_the_node_drained(clock: Clock) -> None:
    backend = Node(reset_fails=True, health_fails=5)
    with pytest.raises(ActionError, match=r"GPU 3 on gpu03: reset and reboot both failed "
                                          r"\(reset: .*Unable to reset.*; reboot: health check "
                                          r"failed: .*Fail - GPU: 3.*gpu03 is left drained"):
        action(backend, clock).run(arguments(), context())
    node = backend.state["gpu03"]
    assert "DRAIN" in node.flags
    assert node.reason.startswith("GPU 3: reset and reboot did not clear it: health check")
    assert "reset-gpu03" not in backend.reserved
    order = [c[0] for c in backend.calls]
    assert order.index("reboot") < len(order) - 1 - order[::-1].index("update")


def test_a_reboot_that_never_comes_back_times_out_and_drains(clock: Clock) -> None:
    backend = Node(reset_fails=True, reboot_polls=None)
    started = clock.now
    with pytest.raises(ActionError, match=r"reboot: gpu03 still not back from the reboot "
                                          r"after 5m"):
        action(backend, clock).run(arguments(reboot_timeout="5m"), context())
    assert 300 <= clock.now - started < 320
    assert "DRAIN" in backend.state["gpu03"].flags


def test_a_stop_never_falls_back(clock: Clock) -> None:
    backend = Node(reset_fails=True)
    ctx = context()
    ctx.request_stop("the execution was cancelled")
    with pytest.raises(ActionStopped):
        action(backend, clock).run(arguments(), ctx)
    assert not [c for c in backend.calls if c[0] in ("reboot", "srun")]


def test_a_missing_reservation_is_refused_before_any_change(clock: Clock) -> None:
    backend = Node()
    backend.reserved.clear()
    with pytest.raises(ActionError, match="reservation reset-gpu03 with gpu03 does not exist"):
        action(backend, clock).run(arguments(), context())
    assert backend.calls == []


def test_a_drain_someone_else_made_is_refused_before_any_change(clock: Clock) -> None:
    backend = Node()
    backend.state["gpu03"] = replace(backend.state["gpu03"],
                                     reason="bob: PSU fan noise, ticket 4411")
    with pytest.raises(ActionError, match=r"gpu03 is drained by someone else \(not the bot\): "
                                          r'"bob: PSU fan noise, ticket 4411": the reset would '
                                          r"lift that drain, so nothing was changed"):
        action(backend, clock).run(arguments(), context())
    assert backend.calls == [] and backend.state["gpu03"].reason.startswith("bob")


def test_a_node_health_checks_gpu_drain_is_answered_by_the_reset(clock: Clock) -> None:
    """NHC's GPU drain (slurm.health_check_drains) is lifted inside the reservation: the
    reset ends in its own health check; a person's part beside it still refuses."""
    nhc = "NHC: gpu-health-check: Page Retirement/Row Remap Fail - GPU: 3"
    backend = Node()
    backend.state["gpu03"] = replace(backend.state["gpu03"], reason=nhc)
    result = action(backend, clock).run(arguments(), context())
    assert "health check passed" in result.summary
    backend = Node()
    backend.state["gpu03"] = replace(backend.state["gpu03"], reason=f"bob: PSU ++ {nhc}")
    with pytest.raises(ActionError, match="drained by someone else"):
        action(backend, clock).run(arguments(), context())
    assert backend.calls == []


# --- the GPU gate after each health check (adapters/prometheus/gate.py) ------------------


def gated(backend: Node, dcgm: Dcgm, clock: Clock) -> GpuResetAction:
    return GpuResetAction(backend, SlurmConfig(commands=COMMANDS), sleep=clock.sleep,
                          prometheus=dcgm, gpu_settle=0.1)


def test_a_gpu_still_missing_after_reset_and_reboot_leaves_the_node_drained(
        clock: Clock) -> None:
    backend, dcgm = Node(), Dcgm(node="gpu03")
    dcgm.gpus.discard(3)
    with pytest.raises(ActionError, match=r"reset and reboot both failed \(reset: GPU "
                                          r"telemetry: DCGM reports 7 of 8 GPUs of gpu03"):
        gated(backend, dcgm, clock).run(arguments(gpu_telemetry=True), context())
    assert "DRAIN" in backend.state["gpu03"].flags
    assert "GPU telemetry: DCGM reports 7 of 8 GPUs of gpu03: GPU 3 missing" in \
        backend.state["gpu03"].reason


def test_a_gpu_back_after_the_reboot_passes(clock: Clock, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    backend, dcgm = Node(), Dcgm(node="gpu03")
    dcgm.gpus.discard(3)
    rebooting = backend.reboot

    def reboot_brings_it_back(*args: Any) -> None:  # the GPU is back on the bus
        rebooting(*args)
        dcgm.gpus.add(3)

    monkeypatch.setattr(backend, "reboot", reboot_brings_it_back)
    result = gated(backend, dcgm, clock).run(arguments(gpu_telemetry=True), context())
    assert result.details["method"] == "reboot"
    assert result.details["attempts"][0]["error"].startswith("GPU telemetry: DCGM reports 7")
    assert "DRAIN" not in backend.state["gpu03"].flags


def test_the_gate_is_in_the_plan_and_needs_prometheus(clock: Clock) -> None:
    plan = gated(Node(), Dcgm(node="gpu03"), clock).plan(arguments(gpu_telemetry=True))
    assert plan[1].startswith("each health check counts only with its GPUs in DCGM: DCGM in "
                              "Prometheus: 8 GPU(s) of gpu03 report")
    with pytest.raises(ActionError, match="no Prometheus is configured"):
        action(Node(), clock).plan(arguments(gpu_telemetry=True))
