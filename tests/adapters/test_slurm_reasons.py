"""Whose drain it is, over the in-memory Slurm: the bot marks every reason it writes with
its execution; it never erases another owner's reason (a drain adds ours after theirs, an
undo takes back only ours); a return to service lifts only the bot's drains made to work on
the node, never somebody else's or the bot's for a failed check unless asked
(``override_drains``); and a health check that resumed a node drains it again on every way
out but a pass."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from adapters.actions import ActionContext, ActionError, ActionStopped
from adapters.slurm import health, reasons
from adapters.slurm.actions import DrainAction, ReservationDeleteAction, ResumeAction
from adapters.slurm.config import SlurmConfig
from adapters.slurm.fake import FakeSlurm
from adapters.slurm.fleet import ResumeBatchesAction
from adapters.slurm.health import HealthCheckAction

HAND = "bob: PSU fan noise, ticket 4411"
CONFIG = SlurmConfig.model_validate(
    {"commands": {"health-check": {"argv": ["dcgmi", "diag", "-r", "2"],
                                   "accepts_args": True}}})


def ctx(execution_id: int = 7, **extra: Any) -> ActionContext:
    return ActionContext(execution_id=execution_id, step_id="step",
                         deadline=time.monotonic() + 30, **extra)


def slurm(*drained: tuple[str, str]) -> FakeSlurm:
    fake = FakeSlurm(["gpu01", "gpu02", "gpu03"])
    for name, reason in drained:
        fake.update_nodes([name], "DRAIN", reason)
    fake.calls.clear()
    return fake


def act(cls: Any, fake: FakeSlurm) -> Any:
    return cls(fake, CONFIG, lambda s: None)


def test_the_grammar_of_the_bot_reasons() -> None:
    ours = reasons.marked("XID 79", 7)
    assert ours == "XID 79 (execution 7)"
    assert reasons.marked("x" * 400, 7).endswith("x (execution 7)")
    assert len(reasons.marked("x" * 400, 7)) == reasons.MAX_REASON
    both = reasons.joined(HAND, ours)
    assert both == f"{HAND} ++ XID 79 (execution 7)"
    assert [(p.execution, p.failed_check) for p in reasons.parts(both)] == [(None, False),
                                                                            (7, False)]
    assert reasons.without(both, 7) == HAND and reasons.without(ours, 7) == ""
    failed = reasons.marked("health check failed: Row remap", 9, failed_check=True)
    assert failed.endswith("(execution 9: failed check)")
    assert reasons.blocking(ours) is None
    assert reasons.blocking(both) == reasons.Part(HAND, None)
    assert reasons.blocking(failed) == reasons.Part(failed, 9, True)
    assert reasons.blocking("") == reasons.Part("(no reason given)", None)
    long = reasons.joined("y" * 400, ours)
    assert len(long) == reasons.MAX_REASON and long.endswith(" ++ " + ours)


def test_a_verdict_as_long_as_a_reason_does_not_erase_the_one_before_it() -> None:
    """Ours at MAX_REASON once left "" before the joiner (" ++ GPU telemetry: ..."): the
    other owner's reason keeps KEPT characters, ours is cut, each one's mark kept whole."""
    ours = reasons.marked("GPU telemetry: " + "no DCGM error series " * 20, 9, failed_check=True)
    assert len(ours) == reasons.MAX_REASON
    kept = reasons.joined(f"{HAND} ++ XID 48 (execution 5)", ours)
    assert kept.startswith(f"{HAND} ++ XID 48 (execution 5) ++ GPU telemetry: no DCGM")
    assert kept.endswith("error (execution 9: failed check)")
    assert len(kept) <= reasons.MAX_REASON
    assert [(p.execution, p.failed_check) for p in reasons.parts(kept)] == [
        (None, False), (5, False), (9, True)]
    cut = reasons.joined("x" * 150 + " (execution 5)", ours)
    assert len(reasons.parts(cut)[0].text) == reasons.KEPT
    assert reasons.held_by(cut) == {5, 9} and len(cut) <= reasons.MAX_REASON
    assert reasons.joined("  ", ours) == ours


def test_a_drain_keeps_another_owners_reason_and_adds_its_own() -> None:
    fake = slurm(("gpu02", HAND))
    result = act(DrainAction, fake).run(
        DrainAction.Arguments.model_validate({"nodes": "gpu[01-02]", "reason": "XID 48"}), ctx())
    assert fake.state["gpu01"].reason == "XID 48 (execution 7)"
    assert fake.state["gpu02"].reason == f"{HAND} ++ XID 48 (execution 7)"
    assert result.details["kept_reasons"] == {"gpu02": HAND}  # in the audit log
    assert f'gpu02 was drained already ("{HAND}"): that reason is kept' in result.summary
    again = act(DrainAction, fake).run(
        DrainAction.Arguments.model_validate({"nodes": "gpu[01-02]", "reason": "XID 48"}), ctx())
    assert not again.changed  # run again after a crash: nothing more


def test_the_undo_takes_back_only_its_own_part() -> None:
    fake = slurm(("gpu02", HAND))
    act(DrainAction, fake).run(
        DrainAction.Arguments.model_validate({"nodes": "gpu[01-02]", "reason": "XID 48"}), ctx())
    fake.update_nodes(["gpu03"], "DRAIN", "XID 13 (execution 5)")  # another bot run's
    result = act(ResumeAction, fake).run(ResumeAction.Arguments.model_validate(
        {"nodes": "gpu[01-03]", "only_this_run": True, "wait": False}), ctx())
    assert "DRAIN" not in fake.state["gpu01"].flags
    assert "DRAIN" in fake.state["gpu02"].flags and fake.state["gpu02"].reason == HAND
    assert fake.state["gpu03"].reason == "XID 13 (execution 5)"
    assert result.details["resumed"] == ["gpu01"]


def test_the_undo_leaves_a_node_this_run_kept_out_for_a_failed_check() -> None:
    failed = reasons.marked("GPU telemetry: GPU 3 missing", 7, failed_check=True)
    fake = slurm(("gpu01", failed), ("gpu02", f"{HAND} ++ {failed}"),
                 ("gpu03", "MIG layout all-1g.10gb (execution 7)"))
    result = act(ResumeAction, fake).run(ResumeAction.Arguments.model_validate(
        {"nodes": "gpu[01-03]", "only_this_run": True, "wait": False}), ctx())
    assert fake.state["gpu01"].reason == failed and "DRAIN" in fake.state["gpu01"].flags
    assert fake.state["gpu02"].reason == f"{HAND} ++ {failed}"
    assert result.details["resumed"] == ["gpu03"]


@pytest.mark.parametrize("reason,owner", [
    (HAND, "someone else (not the bot)"),
    ("health check failed: Row remap | Fail (execution 5: failed check)",
     "the bot for a failed check (execution 5)"),
    (f"{HAND} ++ XID 48 (execution 5)", "someone else (not the bot)"),
])
def test_a_health_check_does_not_lift_a_drain_it_does_not_answer(reason: str,
                                                                 owner: str) -> None:
    fake = slurm(("gpu02", reason))
    fake.create_reservation("resume-gpu02", ["gpu02"], "now", 3600, ["MAINT"], ["root"])
    check = act(HealthCheckAction, fake)
    plan = check.plan(check.Arguments.model_validate({"node": "gpu02",
                                                       "reservation": "resume-gpu02"}))
    assert f"gpu02 is drained by {owner}" in plan[0] and "STAYS DRAINED" in plan[0]
    with pytest.raises(ActionError, match=rf"gpu02 is drained by {re.escape(owner)}: .*that drain "
                                          r"stays \(nothing was changed\).*override_drains"):
        check.run(check.Arguments.model_validate({"node": "gpu02",
                                                  "reservation": "resume-gpu02"}), ctx())
    assert fake.state["gpu02"].reason == reason and not [c for c in fake.calls
                                                        if c[0] in ("update", "srun")]
    passed = check.run(check.Arguments.model_validate(
        {"node": "gpu02", "reservation": "resume-gpu02", "override_drains": True}), ctx())
    assert "passed" in passed.summary and "DRAIN" not in fake.state["gpu02"].flags


def test_a_health_check_lifts_the_bots_own_maintenance_drain() -> None:
    fake = slurm(("gpu02", "XID 79 (execution 5)"))
    fake.create_reservation("resume-gpu02", ["gpu02"], "now", 3600, ["MAINT"], ["root"])
    check = act(HealthCheckAction, fake)
    args = check.Arguments.model_validate({"node": "gpu02", "reservation": "resume-gpu02"})
    assert "lifted once the node passes" in check.plan(args)[0]
    assert "passed" in check.run(args, ctx()).summary
    assert "DRAIN" not in fake.state["gpu02"].flags


NHC = "NHC: gpu-health-check: Page Retirement/Row Remap Fail - GPU: 3"


@pytest.mark.parametrize("reason", [NHC, f"{NHC} ++ XID 79 (execution 5)",
                                    f"XID 79 (execution 5) ++ {NHC}"])
def test_a_health_check_answers_a_node_health_checks_gpu_drain(reason: str) -> None:
    fake = slurm(("gpu02", reason))
    fake.create_reservation("resume-gpu02", ["gpu02"], "now", 3600, ["MAINT"], ["root"])
    check = act(HealthCheckAction, fake)
    args = check.Arguments.model_validate({"node": "gpu02", "reservation": "resume-gpu02"})
    [note] = [line for line in check.plan(args) if "is drained by" in line]
    assert f'a node health check, which this health check answers: "{NHC}"' in note
    assert note.endswith("lifted once the node passes")
    assert "passed" in check.run(args, ctx()).summary
    assert "DRAIN" not in fake.state["gpu02"].flags


@pytest.mark.parametrize("reason,stays", [
    (f"{HAND} ++ {NHC}", HAND),  # a person's part beside NHC's
    (f"{NHC} ++ health check failed: Row remap (execution 5: failed check)",
     "health check failed: Row remap (execution 5: failed check)"),
    (f"{NHC} (execution 5: failed check)", "the bot for a failed check"),  # the bot's
    ("NHC: check_fs_mount: /scratch not mounted", "NHC: check_fs_mount"),  # not a GPU check
    (f"bob: {NHC}", "bob: NHC"),  # the prefix only at the start of a part
])
def test_a_health_check_still_leaves_every_other_drain(reason: str, stays: str) -> None:
    fake = slurm(("gpu02", reason))
    fake.create_reservation("resume-gpu02", ["gpu02"], "now", 3600, ["MAINT"], ["root"])
    check = act(HealthCheckAction, fake)
    with pytest.raises(ActionError, match=re.escape(stays)):
        check.run(check.Arguments.model_validate({"node": "gpu02",
                                                  "reservation": "resume-gpu02"}), ctx())
    assert fake.state["gpu02"].reason == reason and "DRAIN" in fake.state["gpu02"].flags


def test_no_node_health_check_drains_configured_lifts_none() -> None:
    fake = slurm(("gpu02", NHC))
    fake.create_reservation("resume-gpu02", ["gpu02"], "now", 3600, ["MAINT"], ["root"])
    check = HealthCheckAction(fake, CONFIG.model_copy(update={"health_check_drains": ()}),
                              lambda s: None)
    args = health.HealthCheckArguments.model_validate({"node": "gpu02",
                                                       "reservation": "resume-gpu02"})
    with pytest.raises(ActionError, match="drained by someone else"):
        check.run(args, ctx())
    assert fake.state["gpu02"].reason == NHC


def test_a_routine_resume_never_lifts_a_node_health_checks_drain() -> None:
    """Only a health check answers NHC: a plain return to service (no check) does not."""
    fake = slurm(("gpu02", NHC))
    assert reasons.not_liftable(fake.nodes(["gpu02"], with_jobs=False)) != {}
    assert reasons.blocking(NHC, ["NHC: gpu-health-check:"]) is None
    assert reasons.blocking(NHC, [""]) == reasons.Part(NHC, None)  # an empty prefix: none


def test_a_failed_check_drains_the_node_marked_as_a_failed_check() -> None:
    fake = slurm(("gpu02", "XID 79 (execution 5)"))
    fake.create_reservation("resume-gpu02", ["gpu02"], "now", 3600, ["MAINT"], ["root"])
    check = act(HealthCheckAction, fake)
    with pytest.raises(ActionError, match="left drained with that reason"):
        check.run(check.Arguments.model_validate(
            {"node": "gpu02", "reservation": "resume-gpu02", "args": ["fail"],
             "override_drains": False}), ctx())
    assert fake.state["gpu02"].reason.endswith("(execution 7: failed check)")


def test_a_stop_after_the_resume_drains_the_node_again() -> None:
    fake = slurm(("gpu02", "XID 79 (execution 5)"))
    fake.create_reservation("resume-gpu02", ["gpu02"], "now", 3600, ["MAINT"], ["root"])
    check = act(HealthCheckAction, fake)
    stopping = ctx()
    real = fake.update_nodes

    def cancelled_right_after_the_resume(names: list[str], state: str,
                                         reason: str | None = None) -> None:
        real(names, state, reason)
        if state == "RESUME":
            stopping.request_stop("the execution was cancelled")

    fake.update_nodes = cancelled_right_after_the_resume  # type: ignore[method-assign]
    with pytest.raises(ActionStopped, match=r"did not finish .*cancelled.*gpu02 is left "
                                            r"drained"):
        check.run(check.Arguments.model_validate({"node": "gpu02",
                                                  "reservation": "resume-gpu02"}), stopping)
    assert "DRAIN" in fake.state["gpu02"].flags
    assert fake.state["gpu02"].reason.startswith("health check did not finish")
    assert fake.state["gpu02"].reason.endswith("(execution 7: failed check)")
    assert not [c for c in fake.calls if c[0] == "srun"]  # never checked, never in service


def test_resume_nodes_leaves_drains_it_does_not_answer_and_says_so() -> None:
    failed = "health check failed: Row remap (execution 5: failed check)"
    fake = slurm(("gpu01", "XID 79 (execution 4)"), ("gpu02", failed), ("gpu03", HAND))
    resume = act(ResumeBatchesAction, fake)
    args = resume.Arguments.model_validate({"nodes": "gpu[01-03]"})
    plan = resume.plan(args)
    assert plan[0] == ('gpu01 is drained by the bot (execution 4): "XID 79 (execution 4)": '
                       "lifted once the node passes")
    assert "gpu02 is drained by the bot for a failed check (execution 5)" in plan[1]
    assert "STAYS DRAINED" in plan[1] and "STAYS DRAINED" in plan[2]
    with pytest.raises(ActionError, match=r"resumed gpu01; LEFT DRAINED: gpu02 \(drained by "
                                          r"the bot for a failed check .*gpu03 \(drained by "
                                          r"someone else .*override_drains=true"):
        resume.run(args, ctx())
    assert "DRAIN" not in fake.state["gpu01"].flags
    assert fake.state["gpu02"].reason == failed and fake.state["gpu03"].reason == HAND
    # resume-nodes' own way: said, not raised, so its Kubernetes step still runs
    said = resume.run(resume.Arguments.model_validate({"nodes": "gpu[01-03]",
                                                       "fail_on_left": False}), ctx())
    assert said.summary.startswith("resumed nothing; LEFT DRAINED: gpu02")
    assert said.details["left_drained"].keys() == {"gpu02", "gpu03"}
    assert fake.state["gpu02"].reason == failed and fake.state["gpu03"].reason == HAND
    resume.run(resume.Arguments.model_validate({"nodes": "gpu[01-03]",
                                                "override_drains": True}), ctx())
    assert not any("DRAIN" in node.flags for node in fake.state.values())


def test_close_maintenance_refuses_a_reservation_a_window_or_a_run_holds() -> None:
    delete = ReservationDeleteAction(slurm(), CONFIG, lambda s: None)

    def refusal(name: str, not_the_bots: bool = True) -> str | None:
        return delete.refusal(delete.Arguments.model_validate(
            {"name": name, "not_the_bots": not_the_bots}))

    assert refusal("window-3") == ("reservation window-3 belongs to maintenance window 3 "
                                   "(close it with `runbook window close 3`); nothing was "
                                   "changed")
    assert refusal("resume-gpu03") == (
        "reservation resume-gpu03 belongs to a resume-node run on gpu03 (cancel that "
        "execution, or let it finish: its own steps delete it); nothing was changed")
    for name in ("swap-gpu01", "reset-gpu01", "mig-gpu01", "driver-gpu01", "handoff-gpu04"):
        assert refusal(name) is not None
    assert refusal("rack12") is None and refusal("window-3", not_the_bots=False) is None
    assert refusal("window-x") is None  # not a window's name


class LostController(FakeSlurm):
    """slurmctld goes away while the check runs and answers again after ``down_for`` tries."""

    def __init__(self, down_for: int) -> None:
        super().__init__(["gpu01", "gpu02", "gpu03"])
        self.down_for = down_for
        self.lost = False

    def run_on_node(self, *args: Any, **kwargs: Any) -> tuple[int, str, str]:
        self.lost = True
        raise ActionError("Unable to contact slurm controller (connect failure)")

    def update_nodes(self, names: list[str], state: str, reason: str | None = None) -> None:
        if self.lost and self.down_for > 0:
            self.down_for -= 1
            raise ActionError("Unable to contact slurm controller (connect failure)")
        super().update_nodes(names, state, reason)


def lost_check(fake: LostController) -> Any:
    fake.update_nodes(["gpu02"], "DRAIN", "XID 79 (execution 5)")
    fake.create_reservation("resume-gpu02", ["gpu02"], "now", 3600, ["MAINT"], ["root"])
    check = act(HealthCheckAction, fake)
    return check, check.Arguments.model_validate({"node": "gpu02", "reservation": "resume-gpu02"})


def test_a_lost_controller_finds_the_node_drained_again_when_it_answers() -> None:
    fake = LostController(down_for=3)
    check, args = lost_check(fake)
    with pytest.raises(ActionError, match=r"did not finish .*; gpu02 is left drained$"):
        check.run(args, ctx())
    assert fake.down_for == 0  # it kept trying until slurmctld answered
    assert fake.state["gpu02"].reason.endswith("(execution 7: failed check)")


def test_a_controller_that_never_answers_is_said_with_what_to_do(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health, "REDRAIN_SECONDS", 0.0)
    fake = LostController(down_for=10**6)
    check, args = lost_check(fake)
    with pytest.raises(ActionError, match=r"could not be drained again .*drain it by hand "
                                          r"\(scontrol update NodeName=gpu02 State=DRAIN"):
        check.run(args, ctx())
    assert "DRAIN" not in fake.state["gpu02"].flags  # resumed, unchecked: the error says so
