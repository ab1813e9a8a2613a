"""run_on_node over slurmrestd (transports/rest/jobs.py): the job it submits, how it reads
the outcome, and what it does when the job hangs or its output is not where the bot looks.
The real slurmrestd of 24.11 and 26.05 runs the same code in test_slurm_versions.py."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from adapters.slurm.backend import SlurmError
from adapters.slurm.config import SlurmConfig
from adapters.slurm.transports.rest.backend import RestBackend
from adapters.slurm.transports.rest.jobs import SCRIPT, NodeJob, exit_status, job_body


def code(number: int, signal: int = 0) -> dict[str, Any]:
    return {"status": ["SUCCESS"], "return_code": {"set": True, "number": number},
            "signal": {"id": {"set": bool(signal), "number": signal}, "name": ""}}


class Slurmrestd:
    """Answers /job/submit and /job/{id} as slurmrestd does; the job "runs" by writing its
    output files when ``states`` reaches an ended state."""

    def __init__(self, states: list[list[str]], exit_code: dict[str, Any],
                 out: str | None = "Pass\n") -> None:
        self.states = states
        self.exit_code = exit_code
        self.out = out
        self.calls: list[tuple[str, str]] = []
        self.body: Mapping[str, Any] = {}

    def request(self, method: str, path: str, body: Mapping[str, Any] | None = None,
                **_: Any) -> dict[str, Any]:
        self.calls.append((method, path))
        if method == "POST":
            self.body = body or {}
            return {"job_id": 41, "errors": []}
        return {"errors": []}

    def get(self, path: str) -> dict[str, Any]:
        self.calls.append(("GET", path))
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        if self.out is not None and {"COMPLETED", "FAILED"} & set(state):
            Path(self.body["job"]["standard_output"]).write_text(self.out)
        return {"jobs": [{"job_id": 41, "job_state": state, "exit_code": self.exit_code}]}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def node_job(server: Slurmrestd, folder: Path, clock: Clock | None = None) -> NodeJob:
    clock = clock or Clock()
    return NodeJob(server, str(folder), clock=clock, sleep=clock.sleep)  # type: ignore[arg-type]


def test_the_command_is_the_jobs_argv_and_never_a_word_of_its_script(tmp_path: Path) -> None:
    hostile = ["/usr/bin/dcgmi", "diag", "-r", "2; rm -rf / $(id) `id`"]
    body = job_body("gpu02", "maint-gpu02", hostile, 150, {"GRB_MODE": "x y"}, tmp_path / "o")
    job = body["job"]
    assert body["script"] == SCRIPT and "dcgmi" not in body["script"]
    assert job["argv"] == ["gpu-runbook-bot", *hostile]  # $0, then "$@" word for word
    assert job["required_nodes"] == ["gpu02"] and job["reservation"] == "maint-gpu02"
    assert job["time_limit"] == {"set": True, "number": 3}  # minutes, rounded up: Slurm ends it
    assert "GRB_MODE=x y" in job["environment"]
    assert not any(v.startswith(("HOME=", "SLURM_CONF=")) for v in job["environment"])
    assert "reservation" not in job_body("gpu02", None, ["true"], 10, {}, tmp_path / "o")["job"]


def test_a_finished_job_gives_its_exit_code_and_output_and_leaves_no_file(tmp_path: Path) -> None:
    server = Slurmrestd([["PENDING"], ["RUNNING"], ["COMPLETING"], ["FAILED"]], code(3),
                        out="Row remap | Fail\n")
    result = node_job(server, tmp_path).run("gpu02", "maint", ["/bin/check"], 60, {})
    assert result == (3, "Row remap | Fail\n", "")
    assert [c for c in server.calls if c[0] != "GET"] == [("POST", "/slurm/{v}/job/submit")]
    assert list(tmp_path.iterdir()) == []


def test_a_job_that_never_ends_is_cancelled_at_the_timeout(tmp_path: Path) -> None:
    server = Slurmrestd([["PENDING"]], code(0))
    with pytest.raises(SlurmError, match=r"job 41 on gpu02 did not finish within 30s; cancelled"):
        node_job(server, tmp_path).run("gpu02", "maint", ["/bin/check"], 30, {})
    assert server.calls[-1] == ("DELETE", "/slurm/{v}/job/41")


def test_output_the_bot_cannot_see_is_an_error_not_an_empty_pass(tmp_path: Path) -> None:
    server = Slurmrestd([["COMPLETED"]], code(0), out=None)
    with pytest.raises(SlurmError, match="job_output_dir must be a folder the nodes write"):
        node_job(server, tmp_path).run("gpu02", None, ["/bin/check"], 30, {})


@pytest.mark.parametrize(("value", "states", "expected"), [
    (code(0), {"COMPLETED"}, 0),
    (code(2), {"FAILED"}, 2),
    (code(0, signal=9), {"CANCELLED"}, 137),  # killed: 128 + signal, as a shell says
    (code(0), {"TIMEOUT"}, 1),  # Slurm ended it, no code: never a pass
    (code(0), {"NODE_FAIL"}, 1),
    (256, {"FAILED"}, 1),  # the raw wait status of older answers
    (None, {"COMPLETED"}, 0),
])
def test_exit_status(value: Any, states: set[str], expected: int) -> None:
    assert exit_status(value, frozenset(states)) == expected


def test_without_a_shared_output_folder_run_on_node_is_refused_at_plan() -> None:
    config = SlurmConfig.model_validate({"backend": "rest", "rest": {
        "url": "http://slurmrestd:6820", "user": "slurm", "token_env": "SLURM_JWT"}})
    backend = RestBackend(config)
    reason = backend.unsupported("run_on_node")
    assert reason is not None and "slurm.rest.job_output_dir" in reason
    assert "slurm.backend: cli" in reason


class Listing:
    """A RestClient whose server lists /job/submit at ``version`` (22.05's does too)."""

    def __init__(self, version: str) -> None:
        self.version = version

    def offers(self, method: str, template: str) -> bool:
        return True


@pytest.mark.parametrize(("version", "refused"), [
    ("v0.0.38", True), ("v0.0.39", True), ("v0.0.40", False), ("v0.0.45", False)])
def test_run_on_node_goes_by_the_version_not_the_listing(version: str, refused: bool) -> None:
    config = SlurmConfig.model_validate({"backend": "rest", "rest": {
        "url": "http://slurmrestd:6820", "user": "slurm", "token_env": "SLURM_JWT",
        "job_output_dir": "/shared/grb"}})
    backend = RestBackend(config)
    backend._client = Listing(version)  # type: ignore[assignment]
    reason = backend.unsupported("run_on_node")
    assert (reason is not None) == refused
    if refused:
        assert reason is not None and "needs v0.0.40 (Slurm 23.11)" in reason
