"""Fast tests of the Slurm adapter without a cluster: hostlists, the JSON of Slurm 22.05
(recorded from the lab) and 24.11 (hand-written from the documented v0.0.40+ format), the
reservation text, the CLI backend's error handling, and the actions over a fake backend."""

from __future__ import annotations

import json
import subprocess
import time
import tracemalloc
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from adapters.actions import ActionContext, ActionError, ActionTimeout
from adapters.slurm import parsing
from adapters.slurm.actions import SlurmActions
from adapters.slurm.backend import Job, Reservation, SlurmctldUnreachable, SlurmError
from adapters.slurm.config import SlurmConfig
from adapters.slurm.fake import FakeSlurm as FakeBackend
from adapters.slurm.transports.choice import make_backend
from adapters.slurm.transports.cli import CliBackend
from kit.hostlist import MAX_NAMES, TooMany, compress, expand, size

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> Any:
    text = (FIXTURES / name).read_text()
    return json.loads(text) if name.endswith(".json") else text


# -- hostlist ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        ("gpu07", ["gpu07"]),
        ("gpu[01-04,07]", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]),
        ("a1,b[2-3]", ["a1", "b2", "b3"]),
        ("gpu[8-11]", ["gpu8", "gpu9", "gpu10", "gpu11"]),
        ("rack[1-2]-gpu[01-02]", ["rack1-gpu01", "rack1-gpu02", "rack2-gpu01", "rack2-gpu02"]),
        ("node.a_b-1,gpu01,gpu01", ["node.a_b-1", "gpu01"]),
    ],
)
def test_expand(expression: str, names: list[str]) -> None:
    assert expand(expression) == names


def test_expand_keeps_padding_over_a_large_range() -> None:
    names = expand("gpu[001-256]")
    assert len(names) == 256
    assert names[0] == "gpu001" and names[99] == "gpu100" and names[-1] == "gpu256"


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("", "empty hostlist"),
        ("gpu07;rm -rf /", "only letters, digits"),
        ("gpu$(id)", "only letters, digits"),
        ("gpu[01", "never closed"),
        ("gpu01]", "without a matching"),
        ("gpu[[01]]", "nested"),
        ("gpu[04-01]", "runs backwards"),
        ("gpu[a-b]", "not a number or a range"),
        ("gpu[]", "empty brackets"),
        ("a,,b", "empty name"),
        ("gpu[0-99999]", f"names 100,000 nodes, more than {MAX_NAMES:,}"),
        ("a[0-999]b[0-99]", f"names 100,000 nodes, more than {MAX_NAMES:,}"),
        ("gpu[" + "9" * 64 + "]", "more than 63 digits"),
    ],
)
def test_expand_refuses(expression: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("$", r"\$")):
        expand(expression)


@pytest.mark.parametrize(
    ("expression", "count"),
    [
        ("gpu07", 1),
        ("gpu[01-04,07],cpu1", 6),
        ("gpu[01-04,03-08]", 8),  # a number given twice in a bracket counts once
        ("gpu[01-08],gpu[01-08]", 8),  # so does a part given twice
        ("gpu[1-9,01-09]", 18),  # other widths are other names
        ("rack[1-2]-gpu[01-04]", 8),
        ("gpu[0-99999999]", 100_000_000),
        ("gpu[" + ",".join(["0-9999"] * 1000) + "]", 10_000),
        ("a[0-999999]b[0-999999]", 10**12),
    ],
)
def test_size_counts_names_without_making_them(expression: str, count: int) -> None:
    assert size(expression) == count
    if count <= MAX_NAMES:
        assert len(expand(expression)) == count


def test_expand_keeps_the_order_names_are_first_given() -> None:
    assert expand("gpu[07,01-04,03-08],gpu02,cpu1") == [
        "gpu07", "gpu01", "gpu02", "gpu03", "gpu04", "gpu05", "gpu06", "gpu08", "cpu1"]
    assert expand("gpu[5-6,1-9]") == [f"gpu{n}" for n in (5, 6, 1, 2, 3, 4, 7, 8, 9)]


def test_expand_refuses_more_names_than_its_limit_naming_both() -> None:
    assert expand("gpu[01-08]", limit=8) == [f"gpu{n:02d}" for n in range(1, 9)]
    assert expand("gpu[01-08],gpu[01-08],gpu01", limit=8)[-1] == "gpu08"  # repeats are free
    with pytest.raises(TooMany, match=r"'gpu\[0-9999\]' names 10,000 nodes, more than 8") as caught:
        expand("gpu[0-9999]", limit=8)
    assert (caught.value.count, caught.value.limit) == (10_000, 8)
    with pytest.raises(TooMany, match=rf"names 100,000,000 nodes, more than {MAX_NAMES:,}"):
        expand("gpu[0-99999999]", limit=10**9)  # MAX_NAMES stays the ceiling


@pytest.mark.parametrize(
    "expression",
    [
        "gpu[" + ",".join(["0-9999"] * 500) + "]",  # 5 million names before, as written
        ",".join(["gpu[0-9999]"] * 500),
        ",".join(f"gpu[0-9999]x{n}" for n in range(500)),
        "gpu[0-99999999]",
        "a[0-99999]b[0-99999]c[0-99999]",
    ],
)
def test_a_huge_hostlist_is_refused_before_a_name_is_made(expression: str) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(TooMany, match=r"more than 8$") as caught:
            expand(expression, limit=8)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert caught.value.count >= 10_000
    assert peak < 5_000_000  # bytes: ten thousand short names at most, never millions
    assert len(str(caught.value)) < 200  # the expression is cut short in the message


@pytest.mark.parametrize(
    ("names", "expression"),
    [
        (["gpu07"], "gpu07"),
        (["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"], "gpu[01-04,07]"),
        (["gpu04", "gpu01", "gpu02", "gpu02"], "gpu[01-02,04]"),
        (["a1", "b2", "b3"], "a1,b[2-3]"),
        (["gpu9", "gpu10"], "gpu[9-10]"),
        (["gpu09", "gpu10"], "gpu[09-10]"),
        (["gpu9", "gpu01"], "gpu9,gpu01"),
        (["login", "gpu1"], "login,gpu1"),
    ],
)
def test_compress(names: list[str], expression: str) -> None:
    assert compress(names) == expression
    assert sorted(expand(expression)) == sorted(set(names))


def test_compress_round_trips_256_nodes() -> None:
    names = expand("gpu[001-256]")
    assert compress(names) == "gpu[001-256]"
    assert compress(reversed(names)) == "gpu[001-256]"


def test_compress_refuses_bad_names() -> None:
    with pytest.raises(ValueError, match="not a valid node name"):
        compress(["gpu 01"])
    with pytest.raises(ValueError, match="empty"):
        compress([])


def refusal(expression: str) -> str:
    with pytest.raises(ValueError) as caught:
        expand(expression)
    return str(caught.value)


def test_refusals_name_the_characters_and_what_to_write() -> None:
    assert refusal(" ") == "empty hostlist: give node names like gpu07 or gpu[01-04,07]"
    allowed = "only letters, digits, '.', '_', '-', brackets, commas and ranges are allowed"
    assert refusal("GPU07;rm -rf /") == f"hostlist 'GPU07;rm -rf /' contains ' /;': {allowed}"
    many = "a!@#$%^&*(){}"  # twelve characters that are not allowed: the first ten are named
    assert refusal(many) == f"hostlist {many!r} contains {'!#$%&()*@^'!r}: {allowed}"
    assert refusal("gpu[1-x]") == "hostlist 'gpu[1-x]': '1-x' is not a number or a range like 01-04"


def test_long_expressions_are_cut_short_in_messages() -> None:
    sixty = "g" * 59 + ";"
    assert refusal(sixty).startswith(f"hostlist {sixty!r} contains ';'")
    longer = "g" * 60 + ";"
    assert refusal(longer).startswith(f"hostlist {'g' * 57 + '...'!r} contains ';'")


def test_a_number_of_63_digits_is_a_name() -> None:
    number = "1" + "0" * 62
    assert expand(f"gpu[{number}]") == [f"gpu{number}"]


def test_too_many_keeps_the_expression() -> None:
    with pytest.raises(TooMany) as caught:
        expand("gpu[1-9]", limit=2)
    assert caught.value.expression == "gpu[1-9]"


def test_compress_groups_unpadded_numbers_of_one_and_more_digits() -> None:
    """A one-digit 0 is not zero padding: gpu0, gpu5 and gpu10 are one range of width 0."""
    assert compress(["gpu0", "gpu5", "gpu10"]) == "gpu[0,5,10]"
    assert compress(["login", "login", "gpu1"]) == "login,gpu1"
    with pytest.raises(ValueError) as caught:
        compress([])
    assert str(caught.value) == "cannot compress an empty list of node names"


# -- parsing: 22.05 (recorded from the lab) -----------------------------------------------


def test_nodes_22_05() -> None:
    nodes = {n.name: n for n in parsing.parse_nodes(fixture("sinfo-22.05.json"))}
    assert set(nodes) == {"gpu01", "gpu02", "gpu03", "gpu04"}
    gpu01 = nodes["gpu01"]
    assert (gpu01.state, gpu01.flags) == ("idle", frozenset({"DRAIN"}))
    assert gpu01.drained and not gpu01.draining and gpu01.idle_ish
    assert (gpu01.reason, gpu01.reason_user, gpu01.reason_time) == ("XID 79", "root", 1796033570)
    assert (gpu01.gpus_total, gpu01.gpus_used) == (8, 0)
    gpu03 = nodes["gpu03"]
    assert gpu03.state == "mixed" and gpu03.flags == frozenset()
    assert (gpu03.gpus_total, gpu03.gpus_used) == (8, 2)
    assert not gpu03.idle_ish and not gpu03.drained
    assert nodes["gpu04"].reason_time is None and nodes["gpu04"].reason_user is None


def test_jobs_22_05() -> None:
    jobs = {j.id: j for j in parsing.parse_jobs(fixture("squeue-22.05.json"))}
    running, pending = jobs[5], jobs[6]
    assert (running.name, running.user, running.account) == ("train-llm", "root", "ml-research")
    assert running.state == "RUNNING" and running.active and running.nodes == ["gpu03"]
    assert pending.state == "PENDING" and not pending.active and pending.nodes == ["gpu01"]


def test_accounting_22_05_clips_to_the_window() -> None:
    data = fixture("sacct-22.05.json")
    job = data["jobs"][0]
    start = job["time"]["start"]
    usage = parsing.parse_accounting(
        data, datetime.fromtimestamp(start - 100), datetime.fromtimestamp(start + 3)
    )
    row = next(u for u in usage if u.account == "ml-research")
    assert row.jobs == 1
    assert row.gpu_hours == pytest.approx(2 * 3 / 3600, abs=1e-6)  # 2 GPUs for 3 of 6 s
    assert row.mean_queue_wait_seconds == job["time"]["start"] - job["time"]["eligible"]


def test_reservations_text() -> None:
    found = {r.name: r for r in parsing.parse_reservations(fixture("reservations-22.05.txt"))}
    maint = found["maint-gpu04"]
    assert maint.nodes == ["gpu04"]
    assert maint.flags == frozenset({"MAINT", "IGNORE_JOBS", "SPEC_NODES"})
    assert maint.users == ["root"] and maint.state == "ACTIVE"
    assert maint.start.startswith("2026-") and maint.end > maint.start
    later = found["later"]
    assert later.nodes == ["gpu02", "gpu03"] and later.users == ["root", "alice"]
    assert parsing.parse_reservations("No reservations in the system\n") == []


def test_key_values_keep_spaces_inside_values() -> None:
    fields = parsing.key_values("A=1 Comment=two words B=(null)")
    assert fields == {"A": "1", "Comment": "two words", "B": "(null)"}


# -- parsing: 24.11 (hand-made fixtures; not checked against a real 24.11) ----------------


def test_nodes_24_11_state_lists_and_number_objects() -> None:
    nodes = {n.name: n for n in parsing.parse_nodes(fixture("scontrol-nodes-24.11.json"))}
    gpu07 = nodes["gpu07"]
    assert (gpu07.state, gpu07.flags) == ("idle", frozenset({"DRAIN"}))
    assert gpu07.drained and gpu07.reason == "XID 79" and gpu07.reason_user == "alice"
    assert gpu07.reason_time == 1730001000 and gpu07.boot_time == 1730000000
    assert (gpu07.gpus_total, gpu07.gpus_used) == (8, 0)
    gpu08 = nodes["gpu08"]
    assert gpu08.state == "mixed" and gpu08.draining and not gpu08.drained
    assert gpu08.gpus_used == 3  # "gpu:h100:3(IDX:0-1,5)": the comma inside IDX is no entry
    gpu09 = nodes["gpu09"]
    assert gpu09.state == "down" and gpu09.flags == frozenset({"NOT_RESPONDING"})
    assert not gpu09.responding and gpu09.boot_time is None
    gpu10 = nodes["gpu10"]
    assert gpu10.state == "allocated" and (gpu10.gpus_total, gpu10.gpus_used) == (8, 8)
    assert gpu10.reason_time is None and gpu10.reason_user is None


def test_sinfo_records_24_11() -> None:
    nodes = parsing.parse_nodes(fixture("sinfo-24.11.json"))
    assert [n.name for n in nodes] == ["gpu11", "gpu12"]
    assert all(n.drained and n.reason == "swap PSU" and n.reason_user == "carol" for n in nodes)
    assert nodes[0].reason_time == 1730005000 and nodes[0].gpus_total == 8


def test_jobs_24_11() -> None:
    jobs = {j.id: j for j in parsing.parse_jobs(fixture("squeue-24.11.json"))}
    assert jobs[4242].state == "RUNNING" and jobs[4242].nodes == ["gpu08", "gpu10"]
    assert jobs[4242].user == "alice" and jobs[4242].account == "ml-research"
    assert jobs[4243].state == "PENDING" and jobs[4243].nodes == ["gpu07"]
    assert jobs[4244].state == "COMPLETED" and not jobs[4244].active


def test_accounting_24_11() -> None:
    usage = {u.account: u for u in parsing.parse_accounting(
        fixture("sacct-24.11.json"),
        datetime.fromtimestamp(1729990000), datetime.fromtimestamp(1730010000))}
    ml = usage["ml-research"]
    assert ml.jobs == 1 and ml.gpu_hours == pytest.approx(7 * 3600 / 3600)
    assert ml.mean_queue_wait_seconds == 60
    assert usage["inference"].jobs == 1 and usage["inference"].gpu_hours == 0


def test_number_objects() -> None:
    assert parsing.number({"set": True, "infinite": False, "number": 5}) == 5
    assert parsing.number({"set": False, "infinite": False, "number": 5}) is None
    assert parsing.number({"set": True, "infinite": True, "number": 0}) is None
    assert parsing.number(7) == 7 and parsing.number(None) is None and parsing.number(True) is None


@pytest.mark.parametrize(
    ("gres", "count"),
    [("gpu:h100:8", 8), ("gpu:8", 8), ("gpu:h100:2(IDX:0-1)", 2), ("gpu:h100:0(IDX:N/A)", 0),
     ("gpu:a100:4(S:0),gpu:h100:4(S:1)", 8), ("(null)", 0), ("", 0)],
)
def test_gpu_count(gres: str, count: int) -> None:
    assert parsing.gpu_count(gres) == count


# -- the CLI backend over a fake runner -----------------------------------------------------


class FakeRunner:
    """Answers Slurm commands from a table; records every argv."""

    def __init__(self, answers: Mapping[str, tuple[int, str, str]]) -> None:
        self.answers = dict(answers)
        self.calls: list[list[str]] = []
        self.envs: list[Mapping[str, str]] = []

    def __call__(self, argv: list[str], *, env: Mapping[str, str],
                 timeout: float) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv)
        self.envs.append(env)
        key = " ".join(Path(argv[0]).name.split() + argv[1:])
        for prefix, (code, out, err) in self.answers.items():
            if key.startswith(prefix):
                return subprocess.CompletedProcess(argv, code, out, err)
        raise AssertionError(f"unexpected command {argv}")


def test_cli_uses_scontrol_json_on_24_11_and_sets_slurm_conf() -> None:
    runner = FakeRunner({
        "sinfo --version": (0, "slurm 24.11.5\n", ""),
        "scontrol show nodes --json": (0, json.dumps(fixture("scontrol-nodes-24.11.json")), ""),
        "squeue --json": (0, json.dumps(fixture("squeue-24.11.json")), ""),
    })
    backend = CliBackend(SlurmConfig(slurm_conf="/etc/slurm/x.conf", bin_dir="/opt/slurm/bin"),
                         runner=runner)
    nodes = backend.nodes(["gpu10", "gpu08"])
    assert [n.name for n in nodes] == ["gpu10", "gpu08"]
    assert nodes[0].jobs == [4242] and nodes[1].jobs == [4242]
    assert runner.calls[0][0] == "/opt/slurm/bin/sinfo"
    assert all(env["SLURM_CONF"] == "/etc/slurm/x.conf" for env in runner.envs)
    assert [j.id for j in backend.jobs(["gpu07"])] == [4243]


def test_cli_uses_sinfo_json_on_22_05() -> None:
    runner = FakeRunner({
        "sinfo --version": (0, "slurm-wlm 22.05.8\n", ""),
        "sinfo --json": (0, json.dumps(fixture("sinfo-22.05.json")), ""),
        "squeue --json": (0, json.dumps(fixture("squeue-22.05.json")), ""),
    })
    nodes = CliBackend(SlurmConfig(), runner=runner).nodes(None)
    assert {n.name: n.jobs for n in nodes}["gpu03"] == [5]


def test_cli_update_is_one_scontrol_call_with_a_hostlist() -> None:
    runner = FakeRunner({"scontrol update": (0, "", "")})
    CliBackend(SlurmConfig(), runner=runner).update_nodes(
        expand("gpu[001-256]"), "DRAIN", "XID 79")
    assert runner.calls == [["scontrol", "update", "NodeName=gpu[001-256]", "State=DRAIN",
                             "Reason=XID 79"]]


def test_cli_slurmctld_down_json_errors_become_a_clear_error() -> None:
    down = {"meta": {}, "errors": [{"error": "Unspecified error", "errno": -1}], "nodes": []}
    runner = FakeRunner({
        "sinfo --version": (0, "slurm 22.05.8\n", ""),
        "sinfo --json": (0, json.dumps(down), ""),
        "scontrol ping": (1, "Slurmctld(primary) at vm is DOWN\n", ""),
    })
    with pytest.raises(SlurmctldUnreachable, match=r"slurmctld is not answering .*check that"):
        CliBackend(SlurmConfig(), runner=runner).nodes(None)


def test_cli_slurmctld_down_stderr_becomes_a_clear_error() -> None:
    stderr = "slurm_update error: Unable to contact slurm controller (connect failure)\n"
    runner = FakeRunner({"scontrol update": (1, "", stderr)})
    with pytest.raises(SlurmctldUnreachable) as caught:
        CliBackend(SlurmConfig(), runner=runner).update_nodes(["gpu01"], "DRAIN", "x")
    assert "Unable to contact slurm controller" in str(caught.value)
    assert caught.value.argv[:2] == ["scontrol", "update"]


def test_cli_other_errors_are_verbatim_with_the_command() -> None:
    runner = FakeRunner({"scontrol create": (1, "", "Error creating the reservation: "
                                                    "Requested nodes are busy\n")})
    with pytest.raises(SlurmError) as caught:
        CliBackend(SlurmConfig(), runner=runner).create_reservation(
            "m", ["gpu01"], "now", 60, ["MAINT"], ["root"])
    text = str(caught.value)
    assert "Requested nodes are busy" in text and "ReservationName=m" in text


def test_cli_missing_program_and_timeout() -> None:
    def missing(argv: list[str], *, env: Mapping[str, str],
                timeout: float) -> subprocess.CompletedProcess[str]:
        raise FileNotFoundError(2, "No such file", argv[0])

    with pytest.raises(SlurmError, match="scontrol not found in /nowhere"):
        CliBackend(SlurmConfig(bin_dir="/nowhere"), runner=missing).delete_reservation("m")

    def slow(argv: list[str], *, env: Mapping[str, str],
             timeout: float) -> subprocess.CompletedProcess[str]:
        raise subprocess.TimeoutExpired(argv, timeout)

    with pytest.raises(SlurmError, match="timed out after 3s"):
        CliBackend(SlurmConfig(timeout=3), runner=slow).delete_reservation("m")


def test_real_runner_times_out_and_terminates(tmp_path: Path) -> None:
    from adapters.slurm.transports.cli import run_process

    marker = tmp_path / "terminated"
    script = (f"trap 'echo TERM > {marker}; kill $!; exit 0' TERM; "
              "sleep 30 >/dev/null 2>&1 & wait")
    with pytest.raises(subprocess.TimeoutExpired):
        run_process(["sh", "-c", script], env={"PATH": "/usr/bin:/bin"}, timeout=0.3)
    assert marker.read_text() == "TERM\n"  # told to end (SIGTERM), not left to run 30 s


def test_make_backend_cli_by_default() -> None:
    assert isinstance(make_backend(SlurmConfig()), CliBackend)


def test_config_forbids_unknown_keys() -> None:
    with pytest.raises(ValidationError):
        SlurmConfig.model_validate({"backend": "cli", "slurmconf": "/x"})
    config = SlurmConfig.model_validate(
        {"commands": {"health-check": {"argv": ["dcgmi", "diag", "-r", "2"]}}})
    assert config.commands["health-check"].argv[0] == "dcgmi"


# -- actions over a fake backend ------------------------------------------------------------


def context(seconds: float = 30, lines: list[str] | None = None) -> ActionContext:
    sink = lines if lines is not None else []
    return ActionContext(execution_id=1, step_id="s", deadline=time.monotonic() + seconds,
                         progress=sink.append)


def actions(backend: FakeBackend, **config: Any) -> dict[str, Any]:
    return SlurmActions(backend, SlurmConfig.model_validate(config),
                        sleep=lambda s: None).by_name()


def test_action_names_and_plans() -> None:
    acts = actions(FakeBackend(["gpu07"]), commands={"health-check": {
        "argv": ["dcgmi", "diag", "-r", "2"]}})
    assert sorted(acts) == sorted([
        "slurm.drain", "slurm.resume", "slurm.wait_idle", "slurm.reservation_create",
        "slurm.reservation_delete", "slurm.reboot", "slurm.run_on_node", "slurm.node_info"])

    def plan(action_name: str, /, **kwargs: Any) -> list[str]:
        action = acts[action_name]
        result: list[str] = action.plan(action.Arguments(**kwargs))
        return result

    assert plan("slurm.drain", nodes="gpu07", reason="XID 79") == [
        'scontrol update NodeName=gpu07 State=DRAIN Reason="XID 79 (execution <this '
        'execution>)"', "a node drained already keeps its reason; this one is added after it "
        '("THEIRS ++ XID 79 (execution <this execution>)")']
    assert plan("slurm.resume", nodes="gpu[07-08]", wait=False) == [
        "scontrol update NodeName=gpu[07-08] State=RESUME"]
    assert plan("slurm.reservation_create", name="maint-gpu07", nodes="gpu07",
                duration="2h") == [
        "scontrol create reservation ReservationName=maint-gpu07 Nodes=gpu07 StartTime=now "
        "Duration=02:00:00 Flags=MAINT,IGNORE_JOBS Users=root"]
    assert plan("slurm.reservation_delete", name="maint-gpu07") == [
        "scontrol delete ReservationName=maint-gpu07"]
    assert plan("slurm.reboot", nodes="gpu07", reason="driver 550") == [
        'scontrol reboot ASAP nextstate=RESUME reason="driver 550" gpu07']
    assert plan("slurm.run_on_node", node="gpu07", reservation="maint-gpu07",
                command="health-check") == [
        "srun -w gpu07 -N1 -n1 --export=PATH,HOME,USER,LOGNAME,LANG,LC_ALL,TZ "
        "--reservation=maint-gpu07 -- dcgmi diag -r 2"]
    assert "at most 30m" in plan("slurm.wait_idle", nodes="gpu07", timeout="30m")[-1]


def test_arguments_are_validated() -> None:
    acts = actions(FakeBackend(["gpu07"]))
    with pytest.raises(ValidationError, match="only letters"):
        acts["slurm.drain"].Arguments(nodes="gpu07;reboot", reason="x")
    with pytest.raises(ValidationError):
        acts["slurm.drain"].Arguments(nodes="gpu07", reason="two\nlines")
    with pytest.raises(ValidationError):
        acts["slurm.reboot"].Arguments(nodes="gpu07", reason="x", nextstate="IDLE")
    with pytest.raises(ValidationError, match="not a duration"):
        acts["slurm.wait_idle"].Arguments(nodes="gpu07", timeout="soon")
    with pytest.raises(ValidationError):
        acts["slurm.reservation_create"].Arguments(name="a b", nodes="gpu07", duration=60)
    assert acts["slurm.wait_idle"].Arguments(nodes="gpu07", timeout="1h30m").timeout == 5400


def test_drain_is_one_call_and_idempotent() -> None:
    backend = FakeBackend(expand("gpu[01-04]"))
    backend.state["gpu03"] = replace(backend.state["gpu03"], flags=frozenset({"DRAIN"}))
    drain = actions(backend)["slurm.drain"]
    args = drain.Arguments(nodes="gpu[01-04]", reason="XID 79")
    first = drain.run(args, context())
    assert first.changed and backend.calls == [  # marked as this execution's drain
        ("update", ["gpu01", "gpu02", "gpu04"], "DRAIN", "XID 79 (execution 1)"),
        ("update", ["gpu03"], "DRAIN", "XID 79 (execution 1)")]  # it had no reason to keep
    again = drain.run(args, context())
    assert not again.changed and len(backend.calls) == 2


def test_drain_unknown_node_is_refused() -> None:
    drain = actions(FakeBackend(["gpu01"]))["slurm.drain"]
    with pytest.raises(ActionError, match="Slurm does not know gpu09"):
        drain.run(drain.Arguments(nodes="gpu[01,09]", reason="x"), context())


def test_resume_only_drained_or_down_nodes() -> None:
    backend = FakeBackend(["gpu01", "gpu02"])
    backend.state["gpu02"] = replace(backend.state["gpu02"], flags=frozenset({"DRAIN"}))
    resume = actions(backend)["slurm.resume"]
    result = resume.run(resume.Arguments(nodes="gpu[01-02]"), context())
    assert result.changed and backend.calls == [("update", ["gpu02"], "RESUME", None)]
    assert not resume.run(resume.Arguments(nodes="gpu[01-02]"), context()).changed


def test_resume_times_out_naming_nodes_that_do_not_respond() -> None:
    backend = FakeBackend(["gpu01"])
    backend.state["gpu01"] = replace(backend.state["gpu01"], state="down",
                                     flags=frozenset({"NOT_RESPONDING"}))
    resume = actions(backend)["slurm.resume"]
    with pytest.raises(ActionTimeout, match="gpu01 still not responding"):
        resume.run(resume.Arguments(nodes="gpu01", wait_timeout=0.2), context())


def test_wait_idle_times_out_naming_jobs_and_requeues() -> None:
    backend = FakeBackend(["gpu03"])
    backend.running = [Job(77, "train", "alice", "ml", "RUNNING", ["gpu03"]),
                       Job(78, "queued", "bob", "ml", "PENDING", ["gpu03"])]
    wait = actions(backend)["slurm.wait_idle"]
    lines: list[str] = []
    with pytest.raises(ActionTimeout, match=r"77 \(user alice, name train, running\)") as caught:
        wait.run(wait.Arguments(nodes="gpu03", timeout=0.2, poll=0.05), context(lines=lines))
    assert "78" not in str(caught.value) and lines and "77" in lines[0]
    result = wait.run(wait.Arguments(nodes="gpu03", timeout=5, requeue=True), context())
    assert result.changed and ("requeue", [77]) in backend.calls
    assert not wait.run(wait.Arguments(nodes="gpu03", timeout=5), context()).changed


def test_reservations_idempotent_and_conflicting() -> None:
    backend = FakeBackend(["gpu01", "gpu02"])
    acts = actions(backend)
    create = acts["slurm.reservation_create"]
    args = create.Arguments(name="m", nodes="gpu01", duration=3600)
    assert create.run(args, context()).changed
    assert not create.run(args, context()).changed
    with pytest.raises(ActionError, match="already exists on gpu01, not on gpu02"):
        create.run(create.Arguments(name="m", nodes="gpu02", duration=60), context())
    delete = acts["slurm.reservation_delete"]
    assert delete.run(delete.Arguments(name="m"), context()).changed
    assert not delete.run(delete.Arguments(name="m"), context()).changed
    assert [c[0] for c in backend.calls] == ["create", "delete"]


def test_reboot_skips_nodes_with_a_pending_reboot() -> None:
    backend = FakeBackend(["gpu01", "gpu02"])
    backend.state["gpu02"] = replace(backend.state["gpu02"],
                                     flags=frozenset({"DRAIN", "REBOOT_REQUESTED"}))
    reboot = actions(backend)["slurm.reboot"]
    result = reboot.run(reboot.Arguments(nodes="gpu[01-02]", reason="driver"), context())
    assert backend.calls == [("reboot", ["gpu01"], "RESUME", "driver")]
    assert result.details["reboot_already_pending"] == ["gpu02"]


def test_run_on_node() -> None:
    backend = FakeBackend(["gpu01"])
    backend.reserved["m"] = Reservation("m", ["gpu01"], "s", "e")
    run = actions(backend, commands={
        "health-check": {"argv": ["dcgmi", "diag", "-r", "2"]},
        "tool": {"argv": ["tool"], "accepts_args": True}})["slurm.run_on_node"]
    ok = run.run(run.Arguments(node="gpu01", reservation="m", command="health-check"), context())
    assert ok.details["exit_code"] == 0 and ok.details["stdout"] == "Pass\n"
    with pytest.raises(ActionError, match=r"exited 1 .*Row remap"):
        run.run(run.Arguments(node="gpu01", command="tool", args=["fail"]), context())
    assert run.run(run.Arguments(node="gpu01", command="tool", args=["fail"], expect_exit=1),
                   context()).details["exit_code"] == 1
    with pytest.raises(ActionError, match="not allow-listed"):
        run.plan(run.Arguments(node="gpu01", command="rm"))
    with pytest.raises(ActionError, match="takes no extra arguments"):
        run.plan(run.Arguments(node="gpu01", command="health-check", args=["-x"]))
    with pytest.raises(ActionError, match="reservation nope does not exist"):
        run.run(run.Arguments(node="gpu01", reservation="nope", command="health-check"),
                context())
    backend.state["gpu01"] = replace(backend.state["gpu01"], flags=frozenset({"DRAIN"}))
    with pytest.raises(ActionError, match="resume the node first"):
        run.run(run.Arguments(node="gpu01", command="health-check"), context())


def test_node_info_changes_nothing() -> None:
    info = actions(FakeBackend(["gpu01"]))["slurm.node_info"]
    result = info.run(info.Arguments(nodes="gpu01"), context())
    assert not result.changed and result.details["nodes"][0]["gpus_total"] == 8


@pytest.mark.parametrize("answer", ["specified", "transition"])  # 22.05/24.11, 26.05
def test_resume_accepts_invalid_state_answer_when_drain_cleared(answer: str) -> None:
    """Slurm 22.05 clears DRAIN on never-registered nodes yet answers 'Invalid node state'."""

    class Quirky(FakeBackend):
        def update_nodes(self, names: list[str], state: str, reason: str | None = None) -> None:
            super().update_nodes(names, state, reason)
            raise SlurmError("scontrol update failed (exit 1)", ["scontrol", "update"],
                             f"slurm_update error: Invalid node state {answer}")

    backend = Quirky(["gpu01"])
    backend.state["gpu01"] = replace(backend.state["gpu01"], state="unknown",
                                     flags=frozenset({"DRAIN"}))
    resume = actions(backend)["slurm.resume"]
    result = resume.run(resume.Arguments(nodes="gpu01", wait=False), context())
    assert result.changed and "Invalid node state" in result.details["scontrol_warning"]


def test_node_text_22_05() -> None:
    """``scontrol show node -o``: the quick read the actions use before a change."""
    nodes = {n.name: n for n in parsing.parse_node_text(fixture("scontrol-node-22.05.txt"))}
    gpu001, gpu010 = nodes["gpu001"], nodes["gpu010"]
    assert gpu001.state == "idle" and gpu001.flags == frozenset({"DRAIN"}) and gpu001.drained
    assert (gpu001.reason, gpu001.reason_user) == ("XID 79", "root")
    assert gpu001.reason_time and gpu001.boot_time and gpu001.gpus_total == 8
    assert gpu010.state == "unknown" and gpu010.flags == frozenset({"DRAIN", "NOT_RESPONDING"})
    assert gpu010.boot_time is None and not gpu010.responding


def test_cli_quick_read_tolerates_unknown_names() -> None:
    text = fixture("scontrol-node-22.05.txt")
    runner = FakeRunner({"sinfo --version": (0, "slurm 22.05.8\n", ""),
                         "scontrol show node -o": (1, text, "Node gpu999 not found\n")})
    nodes = CliBackend(SlurmConfig(), runner=runner).nodes(
        ["gpu010", "gpu999", "gpu001"], with_jobs=False)
    assert [n.name for n in nodes] == ["gpu010", "gpu001"]
    assert runner.calls[1:] == [["scontrol", "show", "node", "-o", "gpu[001,010,999]"]]
