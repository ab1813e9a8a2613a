"""The pyslurm backend against tests/adapters/fake_pyslurm.py (pyslurm 25.11's documented API
over an in-memory cluster): every SlurmBackend operation, the version refusals at start,
pyslurm's errors in the adapter's words, and the operations pyslurm cannot do.
"""

from __future__ import annotations

import os
import sys
import textwrap
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from adapters.slurm import commands
from adapters.slurm.backend import SlurmBackend, SlurmctldUnreachable, SlurmError, unsupported
from adapters.slurm.config import SlurmConfig
from adapters.slurm.transports.pyslurm.backend import AUTO_INIT, PyslurmBackend, load_pyslurm
from tests.adapters import fake_pyslurm
from tests.adapters.fake_pyslurm import (
    DbJobState,
    FakeCluster,
    JobState,
    NodeState,
    ReservationFlags,
    RPCError,
)

NODES = ["gpu01", "gpu02", "gpu03", "gpu04"]
CONFIG = SlurmConfig(backend="pyslurm")


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    """Four 8-GPU nodes, gpu01 running a job on 2 GPUs, gpu03 drained; accounts in slurmdbd."""
    found = fake_pyslurm.install(monkeypatch)
    for name in NODES:
        found.nodes[name] = NodeState(features=["h100"], active_features=["h100"])
    found.nodes["gpu01"].base = "MIXED"
    found.nodes["gpu01"].alloc_tres = {"cpu": "4", "gres/gpu": "2", "gres/gpu:h100": "2"}
    # 4 untyped GPUs beside 4 h100 ones; 3 in use, 1 of them an h100
    found.nodes["gpu04"].configured_gres = {"gpu": 4, "gpu:h100": 4}
    found.nodes["gpu04"].alloc_tres = {"gres/gpu": "3", "gres/gpu:h100": "1"}
    found.nodes["gpu03"].flags = {"DRAIN"}
    found.nodes["gpu03"].reason, found.nodes["gpu03"].reason_user = "xid 79", "alice"
    found.jobs[101] = JobState("train", "bob", "ml", "RUNNING", nodes="gpu01")
    found.jobs[102] = JobState("wait", "bob", "ml", "PENDING", required_nodes="gpu[01-02]")
    found.jobs[103] = JobState("done", "eve", "bio", "COMPLETED", nodes="gpu04")
    found.associations = [("root", "root"), ("ml", "bob"), ("ml", "carol"), ("bio", "eve")]
    return found


@pytest.fixture
def backend(cluster: FakeCluster) -> PyslurmBackend:
    return PyslurmBackend(CONFIG)


def by_name(backend: PyslurmBackend) -> dict[str, object]:
    return {node.name: node for node in backend.nodes()}


# -- reads ----------------------------------------------------------------------------------


def test_it_is_a_slurm_backend(backend: PyslurmBackend) -> None:
    typed: SlurmBackend = backend  # mypy checks the Protocol here
    assert [node.name for node in typed.nodes(["gpu02"])] == ["gpu02"]


def test_nodes_read_state_reason_gres_features_and_jobs(backend: PyslurmBackend) -> None:
    nodes = {node.name: node for node in backend.nodes()}
    assert sorted(nodes) == NODES
    assert (nodes["gpu01"].state, nodes["gpu01"].jobs) == ("mixed", [101])
    # TRES names the GPUs twice (gres/gpu and gres/gpu:h100): 2 used, not 4
    assert (nodes["gpu01"].gpus_total, nodes["gpu01"].gpus_used) == (8, 2)
    assert nodes["gpu01"].gres == "gpu:h100:8"
    assert nodes["gpu03"].drained and nodes["gpu03"].reason == "xid 79"
    assert nodes["gpu03"].reason_user == "alice"
    assert nodes["gpu02"].features == frozenset({"h100"})
    assert nodes["gpu04"].jobs == []  # job 103 is over
    assert (nodes["gpu04"].gpus_total, nodes["gpu04"].gpus_used) == (8, 3)


def test_nodes_keep_the_order_asked_and_leave_out_unknown_names(
        backend: PyslurmBackend, cluster: FakeCluster) -> None:
    before = cluster.count("slurm_load_jobs")
    found = backend.nodes(["gpu04", "gpu99", "gpu02"], with_jobs=False)
    assert [node.name for node in found] == ["gpu04", "gpu02"]
    assert cluster.count("slurm_load_jobs") == before  # with_jobs=False saves the job query


def test_jobs_are_the_running_and_pending_ones_on_the_nodes(backend: PyslurmBackend) -> None:
    assert sorted(job.id for job in backend.jobs(["gpu01"])) == [101, 102]
    assert [job.id for job in backend.jobs(["gpu02"])] == [102]  # pending, asks for gpu02
    assert backend.jobs(["gpu04"]) == []
    running = next(job for job in backend.jobs(["gpu01"]) if job.id == 101)
    assert (running.user, running.account, running.nodes) == ("bob", "ml", ["gpu01"])


# -- node changes ---------------------------------------------------------------------------


def test_a_batch_drains_in_one_modify_naming_a_hostlist(
        backend: PyslurmBackend, cluster: FakeCluster) -> None:
    backend.update_nodes(["gpu01", "gpu02", "gpu04"], "DRAIN", "driver upgrade")
    assert [call for call in cluster.calls if call.startswith("slurm_update_node")] == [
        "slurm_update_node gpu[01-02,04]"]
    nodes = {node.name: node for node in backend.nodes()}
    assert nodes["gpu01"].draining and nodes["gpu02"].drained
    assert {nodes[name].reason for name in ("gpu01", "gpu02", "gpu04")} == {"driver upgrade"}
    assert "DRAIN" in nodes["gpu03"].flags and nodes["gpu03"].reason == "xid 79"


def test_resume_clears_drain_and_reason(backend: PyslurmBackend) -> None:
    backend.update_nodes(["gpu03"], "RESUME", None)
    node = backend.nodes(["gpu03"])[0]
    assert "DRAIN" not in node.flags and node.reason == ""


def test_an_unknown_node_changes_nothing(backend: PyslurmBackend, cluster: FakeCluster) -> None:
    with pytest.raises(SlurmError, match=r"Invalid node name specified \(errno 2018\)"):
        backend.update_nodes(["gpu01", "gpu99"], "DRAIN", "x")
    assert not any("DRAIN" in node.flags for node in backend.nodes(["gpu01", "gpu02"]))


def test_a_state_pyslurm_does_not_know_is_refused_before_any_rpc(
        backend: PyslurmBackend, cluster: FakeCluster) -> None:
    with pytest.raises(SlurmError, match=r"pyslurm refused .*Invalid Node state: SLEEPY"):
        backend.update_nodes(["gpu01"], "SLEEPY", None)
    assert cluster.count("slurm_update_node") == 0


def test_features_are_set_available_and_active_in_one_modify(
        backend: PyslurmBackend, cluster: FakeCluster) -> None:
    backend.update_features(["gpu01", "gpu02"], ["h100", "pool-b"])
    assert cluster.count("slurm_update_node gpu[01-02]") == 1
    assert cluster.nodes["gpu02"].active_features == ["h100", "pool-b"]
    assert backend.nodes(["gpu01"])[0].features == frozenset({"h100", "pool-b"})


def test_clearing_every_feature_is_refused_as_pyslurm_would_send_no_change(
        backend: PyslurmBackend, cluster: FakeCluster) -> None:
    with pytest.raises(SlurmError, match=r"cannot clear a node's features.*backend: cli"):
        backend.update_features(["gpu01"], [])
    assert cluster.nodes["gpu01"].features == ["h100"]
    assert cluster.count("slurm_update_node") == 0


def test_requeue_asks_once_per_job(backend: PyslurmBackend, cluster: FakeCluster) -> None:
    cluster.jobs[104] = JobState("more", "bob", "ml", "RUNNING", nodes="gpu02")
    backend.requeue([101, 104])
    assert cluster.count("slurm_requeue") == 2
    assert {cluster.jobs[job].state for job in (101, 104)} == {"PENDING"}
    assert backend.jobs(["gpu02"]) != [] and backend.nodes(["gpu01"])[0].jobs == []


def test_a_failed_requeue_says_which_jobs_went_first(
        backend: PyslurmBackend, cluster: FakeCluster) -> None:
    with pytest.raises(SlurmError, match=r"Invalid job id.*jobs 101 were requeued before it"):
        backend.requeue([101, 999])
    assert cluster.jobs[101].requeue_count == 1


# -- reservations ---------------------------------------------------------------------------


def test_a_reservation_is_created_read_and_deleted(
        backend: PyslurmBackend, cluster: FakeCluster) -> None:
    backend.create_reservation("maint-1", ["gpu02", "gpu01"], "now+1hours", 90,
                               ["MAINT", "IGNORE_JOBS"], ["root"])
    stored = cluster.reservations["maint-1"]
    assert stored.nodes == "gpu[01-02]"
    assert stored.end_time - stored.start_time == 60 * commands.reservation_minutes(90)
    assert ReservationFlags(stored.flags) == (ReservationFlags.MAINTENANCE
                                              | ReservationFlags.IGNORE_RUNNING_JOBS)
    found = {r.name: r for r in backend.reservations()}["maint-1"]
    assert (found.nodes, found.users, found.state) == (["gpu01", "gpu02"], ["root"], "INACTIVE")
    assert found.flags == frozenset({"MAINT", "IGNORE_JOBS"})
    start = datetime.fromisoformat(found.start)
    assert timedelta(minutes=59) < start - datetime.now() <= timedelta(hours=1)
    assert datetime.fromisoformat(found.end) - start == timedelta(minutes=2)
    backend.delete_reservation("maint-1")
    assert backend.reservations() == []


def test_a_reoccurrence_word_becomes_the_reoccurrence(
        backend: PyslurmBackend, cluster: FakeCluster) -> None:
    backend.create_reservation("nightly", ["gpu04"], "2030-01-31T02:00", 3600,
                               ["MAINT", "DAILY"], ["root"])
    assert cluster.reservations["nightly"].reoccurrence == "DAILY"
    assert cluster.reservations["nightly"].start_time == int(
        datetime(2030, 1, 31, 2, 0).timestamp())
    assert backend.reservations()[0].flags == frozenset({"MAINT", "DAILY"})


@pytest.mark.parametrize(("flags", "start", "words"), [
    (["MAINT", "REPLACE_DOWN"], "now", "REPLACE_DOWN has no pyslurm equivalent"),
    (["DAILY", "WEEKLY"], "now", "one reoccurrence, not DAILY, WEEKLY"),
    (["MAINT"], "tomorrow", "'tomorrow' is neither now"),
])
def test_what_pyslurm_cannot_say_is_refused_before_any_rpc(
        backend: PyslurmBackend, cluster: FakeCluster, flags: list[str], start: str,
        words: str) -> None:
    with pytest.raises(SlurmError, match=words):
        backend.create_reservation("r1", ["gpu01"], start, 600, flags, ["root"])
    assert cluster.count("slurm_create_reservation") == 0 and cluster.reservations == {}


def test_reservation_errors_are_slurms(backend: PyslurmBackend, cluster: FakeCluster) -> None:
    backend.create_reservation("r1", ["gpu01"], "now", 600, ["MAINT"], ["root"])
    with pytest.raises(SlurmError, match="Duplicate reservation name"):
        backend.create_reservation("r1", ["gpu02"], "now", 600, ["MAINT"], ["root"])
    with pytest.raises(SlurmError, match="Requested reservation is invalid"):
        backend.delete_reservation("r2")
    assert list(cluster.reservations) == ["r1"]


# -- slurmdbd and sdiag ---------------------------------------------------------------------


def test_accounting_sums_gpu_hours_and_queue_wait_per_account(
        backend: PyslurmBackend, cluster: FakeCluster) -> None:
    start = datetime(2030, 1, 1, 0, 0)
    t0 = int(start.timestamp())
    cluster.db_jobs = [
        # 2 GPUs for 1 h inside the window, waited 600 s
        DbJobState("ml", t0, t0 + 600, t0 + 1200, t0 + 4800, {"gpu": 2, "gpu:h100": 2}),
        # 4 GPUs from 1 h before the window: only the hour inside counts; waited 0 s
        DbJobState("ml", t0 - 3600, t0 - 3600, t0 - 3600, t0 + 3600, {"gpu:h100": 4}),
        DbJobState("bio", t0 + 60, t0 + 60, t0 + 120, t0 + 120 + 1800, {}),
        DbJobState("old", t0 - 9000, t0 - 9000, t0 - 8000, t0 - 7000, {"gpu": 8}),
    ]
    usage = {row.account: row for row in backend.accounting(start, start + timedelta(hours=2))}
    assert sorted(usage) == ["bio", "ml"]
    assert usage["ml"].gpu_hours == pytest.approx(2 * 1.0 + 4 * 1.0)
    assert (usage["ml"].jobs, usage["ml"].mean_queue_wait_seconds) == (2, 300)
    assert (usage["bio"].gpu_hours, usage["bio"].jobs) == (0, 1)


def test_accounts_are_those_of_the_associations(backend: PyslurmBackend) -> None:
    assert backend.accounts() == ["bio", "ml", "root"]


def test_dbd_queue_is_sdiags_dbd_agent_queue_size(
        backend: PyslurmBackend, cluster: FakeCluster) -> None:
    cluster.dbd_agent_queue_size = 17
    assert backend.dbd_queue() == 17


def test_slurmdbd_down_is_said_plainly(backend: PyslurmBackend, cluster: FakeCluster) -> None:
    cluster.dbd_up = False
    with pytest.raises(SlurmError, match="slurmdbd is not answering") as caught:
        backend.accounts()
    assert not isinstance(caught.value, SlurmctldUnreachable)


# -- what pyslurm cannot do -----------------------------------------------------------------


@pytest.mark.parametrize("operation", ["reboot", "run_on_node", "run_on_nodes"])
def test_operations_without_a_pyslurm_call_are_refused_by_name(
        backend: PyslurmBackend, cluster: FakeCluster, operation: str) -> None:
    reason = unsupported(backend, operation)
    assert reason is not None and "slurm.backend: cli" in reason
    calls = len(cluster.calls)
    with pytest.raises(SlurmError, match=f"{operation} is not supported by the pyslurm backend"):
        if operation == "reboot":
            backend.reboot(["gpu01"], "RESUME", "new driver")
        elif operation == "run_on_node":
            backend.run_on_node("gpu01", None, ["nvidia-smi"], 10)
        else:
            backend.run_on_nodes(["gpu01", "gpu02"], None, ["all_reduce_perf"], 10)
    assert len(cluster.calls) == calls


def test_every_other_operation_is_supported(backend: PyslurmBackend) -> None:
    from adapters.slurm.backend import OPERATIONS

    refused = [op for op in OPERATIONS if unsupported(backend, op) is not None]
    assert refused == ["reboot", "run_on_node", "run_on_nodes"]


# -- errors ---------------------------------------------------------------------------------


def test_slurmctld_down_is_slurmctld_unreachable(
        backend: PyslurmBackend, cluster: FakeCluster) -> None:
    cluster.controller_error = RPCError(1800)
    with pytest.raises(SlurmctldUnreachable, match=r"slurmctld is not answering.*errno 1800"):
        backend.nodes()


@pytest.mark.parametrize(("error", "words"), [
    (RPCError(1005), "libslurm and slurmctld are different Slurm releases"),
    (RPCError(2002, "Access/permission denied"), r"failed: Access/permission denied \(errno"),
])
def test_rpc_errors_keep_slurms_words(backend: PyslurmBackend, cluster: FakeCluster,
                                      error: RPCError, words: str) -> None:
    cluster.controller_error = error
    with pytest.raises(SlurmError, match=words) as caught:
        backend.update_nodes(["gpu01"], "DRAIN", "x")
    assert not isinstance(caught.value, SlurmctldUnreachable)


# -- the checks at start --------------------------------------------------------------------


def test_a_missing_pyslurm_is_refused_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyslurm", None)  # makes `import pyslurm` fail
    with pytest.raises(SlurmError, match=r"pyslurm is not installed.*25\.11.*backend: cli"):
        PyslurmBackend(CONFIG)


def shim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    """An importable ``pyslurm`` module on sys.path, not yet imported."""
    (tmp_path / "pyslurm.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "pyslurm", raising=False)


def test_a_pyslurm_without_its_libslurm_is_refused_clearly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shim(tmp_path, monkeypatch, """
        raise ImportError("libslurm.so.43: cannot open shared object file: No such file")
    """)
    with pytest.raises(SlurmError, match="libslurm it was built against is not here"):
        load_pyslurm((22, 5))


def test_slurm_conf_initialises_libslurm_on_first_import(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(AUTO_INIT, raising=False)
    cluster = FakeCluster()
    monkeypatch.setattr(fake_pyslurm, "CLUSTER", cluster)
    shim(tmp_path, monkeypatch, """
        import os
        from tests.adapters.fake_pyslurm import *
        from tests.adapters.fake_pyslurm import __version__
        AUTO_INIT_AT_IMPORT = os.environ.get("PYSLURM_DISABLE_AUTO_INIT")
    """)
    module = load_pyslurm(None, "/etc/slurm-other/slurm.conf")
    assert module.AUTO_INIT_AT_IMPORT == "1"  # pyslurm's own slurm_init() held back...
    assert cluster.slurm_conf == "/etc/slurm-other/slurm.conf"  # ...and run with the file
    assert AUTO_INIT not in os.environ


@pytest.mark.parametrize(("version", "api", "words"), [
    ("24.11.1", (25, 11, 2), r"is for Slurm 24\.11 but was compiled against .*Slurm 25\.11"),
    ("25.11.2", (25, 5, 0), r"compiled against the headers of Slurm 25\.5"),
    ("garbage", (25, 11, 2), "pyslurm reports no version"),
])
def test_a_pyslurm_not_built_for_its_own_release_is_refused(
        cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch, version: str,
        api: tuple[int, int, int], words: str) -> None:
    monkeypatch.setattr(fake_pyslurm, "__version__", version)
    monkeypatch.setattr(fake_pyslurm, "SLURM_API_VERSION", api)
    with pytest.raises(SlurmError, match=words):
        PyslurmBackend(CONFIG)
    assert cluster.calls == []


def test_a_pyslurm_without_the_25_11_api_is_refused(
        cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(fake_pyslurm, "slurmctld")
    with pytest.raises(SlurmError, match=r"lacks slurmctld: .*needs pyslurm 25\.11's API"):
        PyslurmBackend(CONFIG)


def test_a_cluster_of_another_release_is_refused(cluster: FakeCluster) -> None:
    cluster.version = "22.05.8"
    with pytest.raises(SlurmError, match=r"built for Slurm 25\.11 but slurmctld runs Slurm 22"):
        PyslurmBackend(CONFIG)
    with pytest.raises(SlurmError, match=r"this cluster runs Slurm 22\.05"):
        load_pyslurm((22, 5))


def test_the_release_check_waits_for_slurmctld_then_refuses(cluster: FakeCluster) -> None:
    cluster.controller_error = RPCError(1800)
    backend = PyslurmBackend(CONFIG)  # slurmctld down at start: not a reason to fail
    cluster.db_jobs = []
    assert backend.accounting(datetime.now() - timedelta(hours=1), datetime.now()) == []
    with pytest.raises(SlurmctldUnreachable):
        backend.nodes()
    cluster.controller_error = None
    cluster.version = "26.05.0"
    with pytest.raises(SlurmError, match=r"slurmctld runs Slurm 26\.05\.0"):
        backend.nodes()
    assert cluster.count("slurm_load_node") == 0
