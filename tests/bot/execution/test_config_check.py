"""The configuration check (bot.execution.config_check): the files a configuration names,
what a configured Slurm backend refuses (adapters.slurm.capability), and which shipped
runbooks need a system the configuration leaves out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from adapters.slurm import capability
from adapters.slurm.backend import OPERATIONS
from adapters.slurm.config import SlurmConfig
from bot.config import Config
from bot.execution import assembly, config_check
from bot.runbooks.model import CHECK_KINDS


def rest(**rest: Any) -> SlurmConfig:
    return SlurmConfig.model_validate({"backend": "rest", "rest": {
        "url": "http://127.0.0.1:1", "user": "runbook", "token_env": "T", **rest}})


def test_every_check_kind_is_judged() -> None:
    assert set(config_check.CHECK_SECTIONS) == set(CHECK_KINDS)
    assert set(assembly.CHECK_KINDS) <= set(config_check.CHECK_SECTIONS)


def test_the_cli_backend_does_everything_and_pyslurm_no_job_steps() -> None:
    cli = SlurmConfig()
    assert [capability.refusal(cli, op) for op in OPERATIONS] == [None] * len(OPERATIONS)
    pyslurm = SlurmConfig(backend="pyslurm")
    refused = [op for op in OPERATIONS if capability.refusal(pyslurm, op)]
    assert refused == ["reboot", "run_on_node", "run_on_nodes"]
    with pytest.raises(ValueError, match="not a SlurmBackend operation"):
        capability.refusal(cli, "format_disk")


def test_slurmrestd_by_its_pinned_version_or_unknown() -> None:
    unpinned = rest(job_output_dir="/tmp")
    assert capability.refusal(unpinned, "update_nodes") == capability.UNKNOWN
    assert capability.refusal(unpinned, "nodes") is None
    assert "no node reboot" in str(capability.refusal(unpinned, "reboot"))
    assert "srun's MPI plugin" in str(capability.refusal(unpinned, "run_on_nodes"))
    assert "job_output_dir" in str(capability.refusal(rest(), "run_on_node"))
    old = rest(api_version="v0.0.41", job_output_dir="/tmp")
    assert capability.refusal(old, "update_nodes") is None
    assert capability.refusal(old, "create_reservation") == (
        "slurmrestd v0.0.41 (Slurm 24.05) has no reservation create; it needs v0.0.43 "
        "(Slurm 25.05) or later, or slurm.backend: cli")
    assert capability.refusal(rest(api_version="v0.0.43"), "create_reservation") is None


def test_a_backend_that_refuses_a_shipped_step_is_an_error() -> None:
    config = Config(slurm=rest(api_version="v0.0.43", job_output_dir="/tmp"))
    report = config_check.check(config)
    shipped = config.runbook_paths[0]
    refusal = "the configured Slurm backend cannot do it: slurmrestd has no node reboot: no " \
              "API version offers it; use slurm.backend: cli"
    assert report.problems == [
        f"{shipped / 'nccl-test.yaml'}: nccl-test: steps[1] (slurm.nccl_test): the configured "
        f"Slurm backend cannot do it: {capability.refusal(config.slurm, 'run_on_nodes')}",  # type: ignore[arg-type]
        f"{shipped / 'reset-gpu.yaml'}: reset-gpu: steps[4] (slurm.gpu_reset): {refusal}",
        f"{shipped / 'rollback-driver.yaml'}: rollback-driver: steps[1] (slurm.driver_rollout): "
        f"{refusal}",
        f"{shipped / 'upgrade-driver.yaml'}: upgrade-driver: steps[1] (slurm.driver_upgrade): "
        f"{refusal}"]
    assert report.unknown == {}


def test_an_unpinned_slurmrestd_leaves_its_versioned_operations_unchecked() -> None:
    report = config_check.check(Config(slurm=rest(job_output_dir="/tmp")))
    assert sorted(report.unknown) == ["create_reservation", "delete_reservation",
                                      "run_on_node", "update_features", "update_nodes"]
    assert report.unknown["update_features"] == {"handoff-node"}


def test_what_the_server_says_wins_over_the_configuration() -> None:
    asked: list[str] = []

    def ask(operation: str) -> str | None:
        asked.append(operation)
        return "this slurmrestd is too old" if operation == "update_nodes" else None

    report = config_check.check(Config(slurm=rest()), ask=ask)
    assert "update_nodes" in asked and "run_on_nodes" in asked
    assert any(p.endswith("drain-node: steps[0] (slurm.drain): the configured Slurm backend "
                          "cannot do it: this slurmrestd is too old") for p in report.problems)
    assert not any("nccl-test" in p for p in report.problems)  # the server said it can


def test_named_files_and_folders_must_be_there(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t" * 40)
    config = Config.model_validate({
        "server": {"alerts_token_file": str(token), "tls_cert_file": str(tmp_path / "c.pem"),
                   "tls_key_file": str(tmp_path / "k.pem")},
        "audit": {"checkpoint_file": str(tmp_path / "gone" / "checkpoints")},
        "runbook_paths": [str(tmp_path / "site-runbooks")],
        "etcd": {"endpoints": ["http://127.0.0.1:2379"], "backup_dir": str(tmp_path / "bk"),
                 "cacert": str(tmp_path / "etcd-ca.pem")},
    })
    report = config_check.check(config)
    assert report.problems == [
        f"server.tls_cert_file: {tmp_path / 'c.pem'}: no such file",
        f"server.tls_key_file: {tmp_path / 'k.pem'}: no such file",
        f"etcd.cacert: {tmp_path / 'etcd-ca.pem'}: no such file",
        f"etcd.backup_dir: {tmp_path / 'bk'}: no such folder",
        f"audit.checkpoint_file: {tmp_path / 'gone' / 'checkpoints'}: its folder "
        f"{tmp_path / 'gone'} does not exist",
        f"runbook_paths[0]: {tmp_path / 'site-runbooks'}: no such file or folder"]
    assert report.files == 8  # and the default database's place


def test_a_step_under_when_makes_a_runbook_available_in_part() -> None:
    report = config_check.check(Config(kubernetes={"kubeconfig": None}))
    assert report.unavailable["close-maintenance"] == ["the slurm section"]
    assert report.unavailable["restore-etcd"] == [
        "the etcd section", "host_commands.etcd-switch", "the prometheus section"]
    assert "drain-node" not in report.unavailable
    assert report.partial["drain-node"] == ["the slurm section"]
    assert report.problems == []


def test_without_offline_a_server_that_does_not_answer_is_an_error(tmp_path: Path) -> None:
    """Slurm's clients that cannot reach a controller (none on this machine: an empty folder
    of programs) and a Kubernetes API nobody listens on are each named."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    (tmp_path / "bin").mkdir()
    config = Config.model_validate({
        "slurm": {"backend": "cli", "bin_dir": str(tmp_path / "bin"), "timeout": 5},
        "kubernetes": {"kubeconfig": str(kubeconfig), "request_timeout": 2}})
    ask, problems = config_check.servers(config)
    assert [p.split(":")[0] for p in problems] == ["slurm", "kubernetes"]
    assert all(": does not answer: " in p for p in problems)
    assert ask is not None and ask("reboot") is None  # the cli backend does everything
