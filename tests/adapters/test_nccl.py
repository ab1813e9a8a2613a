"""nccl-tests' output read (adapters.slurm.nccl) and slurm.nccl_test over the in-memory Slurm
with a baselines store in memory: the samples in fixtures/nccl are all_reduce_perf's own
formats (2.13's header and device lines; 2.17's version lines and PCI addresses), with
NCCL's INFO lines of two H100 nodes over IB with GPUDirect RDMA, one of them falling back
to sockets, one with IB ports at 200 Gb/s, and one node on NVLink alone."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from adapters.actions import ActionContext, ActionError, ActionStopped
from adapters.slurm import nccl
from adapters.slurm.backend import Job
from adapters.slurm.config import SlurmConfig
from adapters.slurm.fake import FakeSlurm
from adapters.slurm.nccltest import (
    NCCL_ENV,
    Baseline,
    NcclTestAction,
    NcclTestArguments,
    baseline_key,
)
from adapters.slurm.transports.rest.backend import RestBackend

SAMPLES = Path(__file__).parent / "fixtures" / "nccl"
NODES = ["h100-a01", "h100-a02"]
RESERVATION = "nccl-h100-a01-02"
ARGV = ["/opt/nccl-tests/build/all_reduce_perf", "-b", "8", "-e", "1G", "-f", "2", "-g", "8"]


def sample(name: str) -> str:
    return (SAMPLES / name).read_text()


# --- the parser ----------------------------------------------------------------------------


def test_two_nodes_over_ib_read_per_size_with_each_hosts_network() -> None:
    run = nccl.parse(sample("two-nodes-ib.txt"))
    assert run.max_bytes == 1073741824 and run.gpus_per_process == 8
    assert [row.size for row in run.rows] == [2 ** n for n in range(20, 31)]
    last = run.rows[-1]
    assert (last.busbw_out, last.busbw_in) == (187.75, 185.52)
    assert run.busbw == 186.63  # the largest size, out-of-place and in-place averaged
    assert run.avg_busbw == 152.699 and run.wrong == 0
    assert run.devices == {"h100-a01": 8, "h100-a02": 8}
    assert run.models == {"NVIDIA H100 80GB HBM3"}
    assert nccl.networks(run.hosts) == {"h100-a01": "IB/GDRDMA", "h100-a02": "IB/GDRDMA"}
    assert run.hosts["h100-a02"].speeds["mlx5_3:uverbs3:1/IB"] == 400000
    assert run.hosts["h100-a01"].net_channels == 8  # 4 channels, a send and a receive each


def test_one_node_of_nccl_tests_2_17_with_its_newer_lines() -> None:
    run = nccl.parse(sample("one-node-2.17.txt"))
    assert run.max_bytes == 134217728 and run.rows[0].size == 8 and len(run.rows) == 25
    assert run.devices == {"h100-b07": 8}  # [0000:18:00] addresses
    assert nccl.networks(run.hosts) == {"h100-b07": "IB"}  # NVLink channels, IB found
    assert run.hosts["h100-b07"].net_channels == 0
    assert run.busbw == pytest.approx(356.01)


def test_a_socket_fall_back_is_the_hosts_own() -> None:
    run = nccl.parse(sample("socket-fallback.txt"))
    fallen = run.hosts["h100-a02"]
    assert fallen.no_ib and fallen.socket and fallen.network == "Socket" and fallen.fell_back
    assert not run.hosts["h100-a01"].fell_back
    verdict = nccl.judge_hosts(run.hosts, run.devices, dict.fromkeys(NODES, 8), multi=True)
    assert verdict.nodes == ("h100-a02",)
    assert verdict.problems == ("h100-a02 fell back to sockets (NET/IB : No device found, "
                                "NCCL used NET/Socket): its InfiniBand is not usable",)


def test_launcher_tags_and_plugin_networks_are_read() -> None:
    lines = ["[1,8]<stdout>:gpu-b12:4411:4460 [0] NCCL INFO Using network IBext_v8",
             "0: gpu-b12:4411:4467 [7] NCCL INFO Channel 03/0 : 15[7] -> 0[0] [send] via "
             "NET/IBext_v8/3/GDRDMA",
             "gpu-b13:5102:5102 [0] NCCL INFO Using network AWS Libfabric"]
    hosts = nccl.parse_info(lines)
    assert nccl.networks(hosts) == {"gpu-b12": "IB/GDRDMA", "gpu-b13": "AWS Libfabric"}
    assert not any(net.fell_back for net in hosts.values())


@pytest.mark.parametrize(("text", "missing"), [
    ("srun: error: Unable to create step for job 41: Requested nodes are busy\n",
     "no the '# nThread ... nGpus ...' header and no a result row and no the '# Avg bus"),
    ("\x00\x01garbage\n\n-- 12 13\n", "the output starts: '\\x00\\x01garbage'"),
    ("", "the output starts: 'nothing'"),
])
def test_anything_but_a_result_is_an_error_saying_what_is_missing(text: str,
                                                                   missing: str) -> None:
    with pytest.raises(nccl.NcclOutputError, match="not an all_reduce_perf result") as caught:
        nccl.parse(text)
    assert missing in str(caught.value)


def test_a_run_cut_short_has_no_average() -> None:
    text = sample("two-nodes-ib.txt").split("# Out of bounds")[0]
    with pytest.raises(nccl.NcclOutputError, match=r"no the '# Avg bus bandwidth' line"):
        nccl.parse(text)


def test_slow_ports_name_the_slower_node_and_say_what_is_known() -> None:
    run = nccl.parse(sample("slow-ports.txt"))
    verdict = nccl.judge_bandwidth(run, NODES, 186.63, 0.8)
    assert verdict.nodes == ("h100-a02",)
    assert verdict.problems == (
        "bus bandwidth 95.9 GB/s at 1 GiB across h100-a[01-02] is 51% of the baseline "
        "186.6 GB/s (at least 80% needed): likely h100-a02 (IB ports slower than the "
        "others' 400 Gb/s: h100-a02 200 Gb/s)",)
    assert nccl.judge_bandwidth(run, NODES, 100.0, 0.8).passed


def test_a_slow_run_without_port_speeds_names_every_node_as_a_suspect() -> None:
    text = "\n".join(line for line in sample("slow-ports.txt").splitlines()
                     if "NET/IB: [" not in line)
    verdict = nccl.judge_bandwidth(nccl.parse(text), NODES, 186.63, 0.8)
    assert verdict.nodes == tuple(NODES)
    assert ("one of h100-a[01-02] or a link between them (NCCL printed no IB port speeds for "
            "some nodes; test them in pairs") in verdict.problems[0]


def test_a_missing_gpu_and_a_silent_node_are_named() -> None:
    text = "\n".join(line for line in sample("two-nodes-ib.txt").splitlines()
                     if not line.startswith("#  Rank 15 ") and not line.startswith("h100-a01:"))
    run = nccl.parse(text)
    verdict = nccl.judge_hosts(run.hosts, run.devices, dict.fromkeys(NODES, 8), multi=True)
    assert verdict.nodes == ("h100-a01", "h100-a02")
    assert "no NCCL INFO line from h100-a01" in verdict.problems[0]
    assert verdict.problems[1].startswith("h100-a02 ran the test on 7 GPU(s), not 8")


# --- the action over the in-memory Slurm -----------------------------------------------------


class MemoryBaselines:
    def __init__(self) -> None:
        self.kept: dict[str, Baseline] = {}
        self.first: Baseline | None = None  # what a run racing this one recorded before it

    def get(self, key: str) -> Baseline | None:
        return self.kept.get(key)

    def record(self, baseline: Baseline, replace: bool = False) -> Baseline:
        if self.first is not None:
            self.kept.setdefault(baseline.key, self.first)
        if replace or baseline.key not in self.kept:
            self.kept[baseline.key] = baseline
        return self.kept[baseline.key]


def nccl_bot(output: str, code: int = 0) -> tuple[NcclTestAction, FakeSlurm, MemoryBaselines]:
    slurm = FakeSlurm([*NODES, "h100-a03"])
    slurm.create_reservation(RESERVATION, NODES, "now", 3600, ["MAINT"], ["root"])
    slurm.step_output = (output, code)
    config = SlurmConfig.model_validate({"commands": {"nccl-test": {
        "argv": ARGV, "accepts_args": True, "timeout": 300, "env": {"NCCL_IB_HCA": "mlx5"}}}})
    action = NcclTestAction(slurm, config)
    store = MemoryBaselines()
    action.use_baselines(store)
    return action, slurm, store


def context(cancelled: bool = False) -> ActionContext:
    return ActionContext(execution_id=7, step_id="nccl", deadline=time.monotonic() + 60,
                         cancelled=lambda: cancelled)


def run(action: NcclTestAction, **args: Any) -> Any:
    arguments = NcclTestArguments.model_validate(
        {"nodes": "h100-a[01-02]", "reservation": RESERVATION, **args})
    return action.run(arguments, context())


KEY = "all_reduce_perf 2x8 NVIDIA H100 80GB HBM3 up to 1 GiB"


def test_the_first_run_of_a_shape_records_its_baseline_and_says_so() -> None:
    action, slurm, store = nccl_bot(sample("two-nodes-ib.txt"))
    result = run(action)
    assert result.summary == (
        "186.6 GB/s bus bandwidth at 1 GiB across h100-a[01-02] (IB/GDRDMA); no "
        f"baseline for {KEY} yet: this run's is recorded as it")
    assert result.changed
    assert store.kept[KEY] == Baseline(KEY, 186.63, 152.699, "h100-a[01-02]", 7)
    assert slurm.calls[-1] == ("srun", NODES, RESERVATION, ARGV, 1)
    assert slurm.envs[-1] == {"NCCL_IB_HCA": "mlx5", **NCCL_ENV}
    assert result.details["networks"] == {"h100-a01": "IB/GDRDMA", "h100-a02": "IB/GDRDMA"}
    again = run(action)  # a second run is judged against the first
    assert not again.changed
    assert again.summary.endswith(f": 100% of the baseline 186.6 GB/s ({KEY})")


def test_slow_fails_naming_the_node_and_both_figures() -> None:
    action, _, store = nccl_bot(sample("slow-ports.txt"))
    store.kept[KEY] = Baseline(KEY, 186.63, 152.7, "h100-b[01-02]", 3)
    with pytest.raises(ActionError) as caught:
        run(action)
    said = str(caught.value)
    assert said.startswith("nccl-test failed on h100-a[01-02]: bus bandwidth 95.9 GB/s ")
    assert "51% of the baseline 186.6 GB/s (at least 80% needed): likely h100-a02" in said
    assert store.kept[KEY].execution_id == 3  # a failed run never moves the baseline
    assert run(action, min_share=0.5).summary.endswith(f"51% of the baseline 186.6 GB/s ({KEY})")


def test_a_socket_fall_back_fails_naming_the_node_even_without_a_baseline() -> None:
    action, _, store = nccl_bot(sample("socket-fallback.txt"))
    with pytest.raises(ActionError, match=r"^nccl-test failed on h100-a\[01-02\]: h100-a02 "
                                          r"fell back to sockets"):
        run(action)
    assert store.kept == {}  # a broken run is no baseline


def test_a_run_that_died_still_names_the_node_that_fell_back() -> None:
    died = sample("socket-fallback.txt").split("#\n#  ")[0] + "\n" + "\n".join(
        line for line in sample("socket-fallback.txt").splitlines() if "NCCL INFO" in line)
    action, _, _ = nccl_bot(died, code=1)
    with pytest.raises(ActionError) as caught:
        run(action)
    assert str(caught.value).startswith("nccl-test on h100-a[01-02] did not finish (exit 1: ")
    assert "; h100-a02 fell back to sockets" in str(caught.value)


def test_a_run_racing_another_is_judged_against_the_first_baseline() -> None:
    action, _, store = nccl_bot(sample("slow-ports.txt"))
    store.first = Baseline(KEY, 186.63, 152.7, "h100-b[01-02]", 5, "2026-07-01T10:00:00Z")
    with pytest.raises(ActionError, match=r"51% of the baseline 186\.6 GB/s"):
        run(action)
    assert store.kept[KEY].execution_id == 5


def test_rebaseline_makes_this_run_the_baseline() -> None:
    action, _, store = nccl_bot(sample("slow-ports.txt"))
    store.kept[KEY] = Baseline(KEY, 186.63, 152.7, "h100-b[01-02]", 3)
    result = run(action, rebaseline=True)
    assert result.summary.endswith(f"recorded as the baseline for {KEY}")
    assert store.kept[KEY].busbw == 95.91 and store.kept[KEY].execution_id == 7


def test_sizes_are_appended_and_gpus_checked_against_slurm() -> None:
    action, slurm, _ = nccl_bot(sample("two-nodes-ib.txt"))
    slurm.state["h100-a02"] = replace(slurm.state["h100-a02"], gpus_total=4)
    with pytest.raises(ActionError, match=r"h100-a02 ran the test on 8 GPU\(s\), not 4"):
        run(action, sizes="1M-1G")
    assert slurm.calls[-1][3] == [*ARGV, "-b", "1M", "-e", "1G"]
    assert run(action, gpus=8).changed  # gpus= says what each node must run on


def test_nodes_not_ready_are_refused_before_srun() -> None:
    action, slurm, _ = nccl_bot(sample("two-nodes-ib.txt"))
    with pytest.raises(ActionError, match=r"reservation nccl-other with h100-a\[01-02\] does "
                                          "not exist"):
        run(action, reservation="nccl-other")
    slurm.update_nodes(["h100-a02"], "DRAIN", "swap GPU 3")
    with pytest.raises(ActionError, match=r"h100-a02: idle\+DRAIN.*srun cannot start a job"):
        run(action)
    slurm.update_nodes(["h100-a02"], "RESUME")
    slurm.running = [Job(41, "train", "bob", "ml", "RUNNING", ["h100-a01"])]
    with pytest.raises(ActionError, match=r"h100-a01: .*jobs 41.*srun would wait"):
        run(action)
    assert not any(call[0] == "srun" for call in slurm.calls)


def test_a_cancel_during_the_test_gives_no_verdict() -> None:
    action, _, store = nccl_bot(sample("two-nodes-ib.txt"))
    arguments = NcclTestArguments.model_validate({"nodes": "h100-a[01-02]",
                                                 "reservation": RESERVATION})
    ctx = context()
    original = action.backend.run_on_nodes

    def cancelled_meanwhile(*args: Any, **kwargs: Any) -> tuple[int, str, str]:
        ctx.request_stop("the execution was cancelled")
        return original(*args, **kwargs)

    action.backend.run_on_nodes = cancelled_meanwhile  # type: ignore[method-assign]
    with pytest.raises(ActionStopped, match="ran on h100-a"):
        action.run(arguments, ctx)
    assert store.kept == {}


def test_the_plan_shows_the_srun_line_and_the_verdict() -> None:
    action, _, _ = nccl_bot("")
    arguments = NcclTestArguments.model_validate({"nodes": "h100-a[01-02]",
                                                 "reservation": RESERVATION,
                                                 "min_share": 0.75})
    line, then = action.plan(arguments)
    assert line == (
        "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,NET srun -w 'h100-a[01-02]' -N2 "
        "--ntasks-per-node=1 --export=PATH,HOME,USER,LOGNAME,LANG,LC_ALL,TZ,NCCL_DEBUG,"
        f"NCCL_DEBUG_SUBSYS,NCCL_IB_HCA --reservation={RESERVATION} -- {' '.join(ARGV)}")
    assert "at least 75% of the baseline of this shape" in then
    asked = NcclTestArguments.model_validate({"nodes": "h100-a[01-02]", "asked": "gpu[01-03]",
                                             "reservation": RESERVATION})
    with pytest.raises(ActionError, match=r"Slurm nodes only: of gpu\[01-03\], Slurm has "
                                          r"h100-a\[01-02\]"):
        action.plan(asked)


def test_refused_at_plan_without_a_store_or_on_a_backend_without_srun() -> None:
    config = SlurmConfig.model_validate({"backend": "rest", "rest": {
        "url": "http://127.0.0.1:9", "user": "root", "token_env": "NO_SUCH_TOKEN"}})
    action = NcclTestAction(RestBackend(config), config)
    arguments = NcclTestArguments.model_validate({"nodes": "gpu01", "reservation": "r"})
    assert "keeps its baselines in the bot's database" in str(action.refusal(arguments))
    action.use_baselines(MemoryBaselines())
    refused = str(action.refusal(arguments))
    assert "slurmrestd submits batch jobs only" in refused
    assert refused.endswith("use slurm.backend: cli")


def test_the_baseline_key_is_the_shape_not_the_nodes() -> None:
    run_ = nccl.parse(sample("two-nodes-ib.txt"))
    assert baseline_key(run_, 2, 8) == KEY
    assert nccl.size_text(1 << 30) == "1 GiB" and nccl.size_text(3 << 20) == "3 MiB"
    assert nccl.size_text(1000) == "1000 B"
