"""docs/writing-runbooks.md says which checks each shipped runbook runs: every shipped runbook
has a row, and the row names each check kind of its pre_checks and post_checks and each step
action that judges a node's GPUs. A runbook that gains a check, or a new runbook, fails this
until the table says so."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "writing-runbooks.md"
META = {"name", "when", "timeout", "within", "expect", "retry", "every"}
JUDGING = {"slurm.health_check", "slurm.resume_batches", "slurm.gpu_reset", "slurm.check_gres",
           "slurm.driver_rollout", "slurm.driver_upgrade", "slurm.reservation_release",
           "k8s.gpu_gate", "k8s.gpu_gate_nodes", "k8s.gpu_diag", "prom.gpu_identity",
           "prom.gpu_errors_hold", "gpu_operator.wait_validator", "gpu_operator.driver_versions",
           "etcd.health", "etcd.keys_present", "slurm.nccl_test"}


def rows() -> dict[str, list[str]]:
    """Runbook name -> its row's cells (before, in its steps, after)."""
    text = DOC.read_text().split("### What each shipped runbook checks", 1)[1]
    found: dict[str, list[str]] = {}
    for line in text.split("\n\n", 2)[2].splitlines():
        if not line.startswith("| `"):
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        for name in cells[0].replace("`", "").split(","):
            found[name.strip()] = cells[1:]
    return found


def kinds(checks: list[dict[str, object]]) -> set[str]:
    return {key for check in checks for key in check if key not in META}


RUNBOOKS = sorted(ROOT.glob("runbooks/*.yaml"))


@pytest.mark.parametrize("path", RUNBOOKS, ids=lambda p: p.stem)
def test_the_table_names_every_check_of_the_runbook(path: Path) -> None:
    book = yaml.safe_load(path.read_text())
    table = rows()
    assert book["name"] in table, f"{book['name']} has no row in {DOC.name}'s checks table"
    before, steps, after = table[book["name"]]
    for kind in kinds(book.get("pre_checks") or []):
        assert f"`{kind}`" in before, (book["name"], "before", kind)
    for kind in kinds(book.get("post_checks") or []):
        assert f"`{kind}`" in after, (book["name"], "after", kind)
    for step in book["steps"]:
        if step["action"] in JUDGING:
            assert f"`{step['action']}`" in steps, (book["name"], "steps", step["action"])


def test_the_table_is_read() -> None:
    table = rows()
    assert len(table) >= 20 and "`capacity`" in table["drain-node"][0]
