"""What Slurm 24.11 and 26.05 print, read by the parsers and the CLI backend: JSON captured
from the lab's clients of each release (fixtures lab-<release>-*.json: gpu01 drained, a job
on gpu03, gpu04 in a MAINT reservation), and which client the CLI backend asks per release
(JSON from 23.02 on; 22.05's text only where it has no JSON)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from adapters.slurm import parsing
from adapters.slurm.backend import SlurmError
from adapters.slurm.config import SlurmConfig
from adapters.slurm.transports.cli import CliBackend
from adapters.slurm.transports.rest import parse as restparse
from tests.adapters.test_slurm_parsing import FIXTURES, FakeRunner

RELEASES = ["24.11", "26.05"]
VERSION_LINE = {"24.11": "slurm 24.11.5\n", "26.05": "slurm 26.05.5\n", "22.05": "slurm 22.05.8\n"}


def captured(release: str, what: str) -> Any:
    return json.loads((FIXTURES / f"lab-{release}-{what}.json").read_text())


def answer(release: str, what: str) -> tuple[int, str, str]:
    return 0, json.dumps(captured(release, what)), ""


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("source", ["scontrol-node", "sinfo"])
def test_nodes_of_a_release(release: str, source: str) -> None:
    nodes = {n.name: n for n in parsing.parse_nodes(captured(release, source))}
    drained, busy, maint = nodes["gpu01"], nodes["gpu03"], nodes["gpu04"]
    assert drained.drained and drained.state == "idle" and drained.reason == "XID 79"
    assert (busy.state, busy.gpus_total, busy.gpus_used) == ("mixed", 8, 2)
    # a node in a MAINT reservation: idle with flags (sinfo %t says "maint" from 24.11)
    assert maint.state == "idle" and {"MAINTENANCE", "RESERVED"} <= maint.flags
    assert maint.idle_ish and not maint.drained
    if source == "scontrol-node":
        assert drained.reason_user == "root" and drained.reason_time
        assert drained.boot_time and drained.features == frozenset()
    elif release == "26.05":  # 26.05's sinfo --json no longer says who set the reason
        assert drained.reason_user is None


@pytest.mark.parametrize("release", RELEASES)
def test_jobs_reservations_accounts_and_diag_of_a_release(release: str) -> None:
    [job] = parsing.parse_jobs(captured(release, "squeue"))
    assert (job.name, job.user, job.state, job.nodes) == ("grb-test", "root", "RUNNING",
                                                         ["gpu03"])
    [resv] = restparse.parse_reservations(captured(release, "scontrol-reservation"))
    assert resv.name == "grb-maint" and resv.nodes == ["gpu04"] and resv.users == ["root"]
    assert {"MAINT", "IGNORE_JOBS"} <= resv.flags and resv.start < resv.end
    assert restparse.parse_accounts(captured(release, "sacctmgr-account")) == [
        "cv-research", "ml-research", "root"]
    assert restparse.dbd_agent_queue(captured(release, "sdiag")) == 0


@pytest.mark.parametrize("release", RELEASES)
def test_cli_reads_json_from_every_client_of_a_release(release: str) -> None:
    runner = FakeRunner({
        "sinfo --version": (0, VERSION_LINE[release], ""),
        "scontrol show node gpu[01,03] --json": answer(release, "scontrol-node"),
        "scontrol show reservation --json": answer(release, "scontrol-reservation"),
        "sacctmgr show account --json": answer(release, "sacctmgr-account"),
        "sdiag --json": answer(release, "sdiag"),
    })
    cli = CliBackend(SlurmConfig(), runner=runner)
    # the quick read: only the named nodes, in their order (gpu04, printed too, is left out)
    quick = cli.nodes(["gpu03", "gpu01"], with_jobs=False)
    assert [n.name for n in quick] == ["gpu03", "gpu01"] and quick[1].drained
    assert [r.name for r in cli.reservations()] == ["grb-maint"]
    assert "root" in cli.accounts() and cli.dbd_queue() == 0
    assert not any("-o" in argv or argv == ["sdiag"] for argv in runner.calls)
    assert sum(argv[:2] == ["sinfo", "--version"] for argv in runner.calls) == 1


def test_cli_reads_22_05_text_where_it_has_no_json() -> None:
    sdiag = "DBD Agent queue size: 3\n"
    runner = FakeRunner({
        "sinfo --version": (0, VERSION_LINE["22.05"], ""),
        "scontrol show reservation -o": (0, (FIXTURES / "reservations-22.05.txt").read_text(),
                                         ""),
        "sacctmgr --noheader --parsable2 list account": (0, "root\nml-research\n", ""),
        "sdiag": (0, sdiag, ""),
    })
    cli = CliBackend(SlurmConfig(), runner=runner)
    assert cli.reservations() and cli.accounts() == ["root", "ml-research"]
    assert cli.dbd_queue() == 3
    assert not any("--json" in argv for argv in runner.calls)


def test_cli_slurmdbd_down_in_24_11_words_is_a_clear_error() -> None:
    # 24.11 no longer says "Problem talking to the database" (22.05 does)
    stderr = ("sacctmgr: error: _open_persist_conn: failed to open persistent connection to "
              "host:localhost:6819: Connection refused\n"
              "sacctmgr: error: Sending PersistInit msg: Connection refused\n")
    runner = FakeRunner({"sinfo --version": (0, VERSION_LINE["24.11"], ""),
                         "sacctmgr show account --json": (1, "", stderr)})
    with pytest.raises(SlurmError, match=r"slurmdbd is not answering \(sacctmgr\)"):
        CliBackend(SlurmConfig(), runner=runner).accounts()
