"""bench/benchkit.py: the results file every benchmark writes, and SIGTERM turned into
SystemExit (so a benchmark's finally blocks run)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import benchkit


def test_results_file_holds_the_figures_and_the_machine(tmp_path: Path) -> None:
    path = benchkit.write_results("slurm_drain", {"ratio": 1.2, "goal_met": True}, tmp_path)
    assert path == tmp_path / "slurm_drain.json"
    document = json.loads(path.read_text())
    assert document["bench"] == "slurm_drain"
    assert document["results"] == {"ratio": 1.2, "goal_met": True}
    box = document["machine"]
    assert box["cores"] == os.cpu_count()
    assert box["python"] == ".".join(map(str, sys.version_info[:3]))
    assert box["date"].endswith("Z")
    assert set(box) >= {"cpu_model", "ram_gib", "os", "kernel", "slurm", "load_avg_1m"}


def test_results_file_names_no_host_and_no_path(tmp_path: Path) -> None:
    text = benchkit.write_results("plan_fleet", {"n": 1}, tmp_path).read_text()
    assert os.uname().nodename not in text
    assert str(tmp_path) not in text and str(Path.home()) not in text


def test_a_bad_name_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a benchmark name"):
        benchkit.write_results("../escape", {}, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_finish_prints_the_json_last_and_a_failed_run_keeps_the_good_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    benchkit.finish("k8s_fleet_drain", {"ratio": 9.1}, tmp_path)
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == {"ratio": 9.1}
    benchkit.finish("k8s_fleet_drain", {"error": "SystemExit: 143"}, tmp_path)
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == {"error": "SystemExit: 143"}
    kept = json.loads((tmp_path / "k8s_fleet_drain.json").read_text())
    assert kept["results"] == {"ratio": 9.1}


def test_sigterm_raises_system_exit_so_finally_blocks_run() -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    cleaned = []
    try:
        benchkit.cleanup_on_signals()
        with pytest.raises(SystemExit) as stopped:
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler raises at once, inside the sleep
            finally:
                cleaned.append(True)
        assert stopped.value.code == 128 + signal.SIGTERM
        assert cleaned == [True]
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGHUP, before[1])
