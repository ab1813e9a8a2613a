"""Swap evidence, the last part of swap-gpu's health check: after the check and the GPU gate
passed, the replaced GPU's UUID and serial as nvidia-smi reads them on the node (the
allow-listed node command ``gpu-identity``, one ``index, serial, uuid`` line per GPU) must
be DCGM's (its labels in Prometheus) and none of those before the swap (the
``prom.gpu_identity`` step, read through ``ActionContext.earlier``). Anything else drains
the node again with the verdict, as a failed check; the evidence goes in the step's result.
"""

from __future__ import annotations

from typing import Any, Protocol

from adapters.actions import ActionContext, ActionResult
from adapters.host import allowed_argv
from adapters.prometheus.backend import PrometheusBackend, PrometheusError
from adapters.prometheus.gate import gate_for
from adapters.prometheus.identity import (
    GpuIdentity,
    dcgm_identities,
    parse_identities,
    swap_verdict,
)
from adapters.slurm.backend import SlurmBackend
from adapters.slurm.config import SlurmConfig

__all__ = ["EvidenceFailed", "identity_argv", "parse_identities", "swap_evidence", "swap_verdict"]


class Drains(Protocol):
    """What the health check gives the evidence: its backend, configuration, Prometheus and
    its drain for a failed check."""

    backend: SlurmBackend
    config: SlurmConfig
    prometheus: PrometheusBackend | None

    def _drain(self, node: str, reason: str, ctx: ActionContext) -> None: ...


class EvidenceFailed(Exception):
    """The evidence failed; the node is drained again with the verdict."""


def identity_argv(check: Drains, command: str) -> list[str]:
    return allowed_argv(check.config.commands, command, [], "node command",
                        "slurm.commands")[1]


def swap_evidence(check: Drains, args: Any, passed: ActionResult,
                  ctx: ActionContext) -> ActionResult:
    """``passed`` with the evidence that GPU ``args.identity_gpu`` was replaced, or the node
    drained again and EvidenceFailed saying why."""
    gpu, node = int(args.identity_gpu), args.node
    prometheus = gate_for(check.prometheus, args.dcgm_name or node, 0,
                          f"the swap evidence of {node}").backend
    before = [GpuIdentity(**b) for b in (ctx.earlier(args.identity_before) or {})
              .get("before", [])]
    code, out, err = check.backend.run_on_node(
        node, args.reservation, identity_argv(check, args.identity_command),
        max(1.0, min(check.config.commands[args.identity_command].timeout, ctx.remaining())),
        check.config.commands[args.identity_command].env)
    after = parse_identities(out).get(gpu) if code == 0 else None
    try:
        dcgm = dcgm_identities(prometheus, args.dcgm_name or node, gpu)
        why = swap_verdict(gpu, before, after, dcgm)
    except PrometheusError as exc:
        dcgm, why = [], f"Prometheus did not answer for DCGM's GPU {gpu}: {exc}"
    if code != 0:
        why = f"{args.identity_command} exited {code}: {(err or out).strip()[-150:]}"
    evidence = {"gpu": gpu, "before": [b.as_dict() for b in before],
                "after": after.as_dict() if after else None,
                "dcgm": [d.as_dict() for d in dcgm]}
    if why is not None:
        check._drain(node, f"GPU swap: {why}", ctx)
        raise EvidenceFailed(f"{node} passed its checks but {why}; {node} is left drained "
                             "with that reason")
    assert after is not None
    return ActionResult(f"{passed.summary}; GPU {gpu} replaced: {before[0].show()} -> "
                        f"{after.show()}", {**passed.details, "swap_evidence": evidence})
