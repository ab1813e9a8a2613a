"""Swap evidence without a cluster: ``prom.gpu_identity`` (the GPU before the swap, as DCGM
reports it), nvidia-smi's lines, and the health check's last part: after the swap the GPU's
UUID and serial must be DCGM's and none of those before, else the node stays drained with
the verdict. The lab runs swap-gpu with `lab swap` in tests/runbooks/test_swap_evidence.py."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import pytest

from adapters.actions import ActionContext, ActionError
from adapters.prometheus.backend import PrometheusError, Sample, Series
from adapters.prometheus.config import PrometheusConfig
from adapters.prometheus.identity import (
    GpuIdentity,
    GpuIdentityAction,
    IdentityArguments,
    dcgm_identities,
)
from adapters.slurm.config import SlurmConfig
from adapters.slurm.fake import FakeSlurm
from adapters.slurm.health import HealthCheckAction, HealthCheckArguments
from adapters.slurm.identity import parse_identities, swap_verdict

OLD = GpuIdentity("GPU-1a2b3c4d-0000-1111-2222-333344445555", "1654922012345")
NEW = GpuIdentity("GPU-9f8e7d6c-aaaa-bbbb-cccc-ddddeeeeffff", "1654922099999")
IDENTITY = "--query-gpu=index,serial,uuid"
CONFIG = SlurmConfig.model_validate({"commands": {
    "health-check": {"argv": ["dcgmi", "diag"]},
    "gpu-identity": {"argv": ["nvidia-smi", IDENTITY, "--format=csv,noheader"]}}})


def smi(gpu3: GpuIdentity | None) -> str:
    """nvidia-smi's answer: eight GPUs, GPU 3 as given (left out: off the bus)."""
    lines = [f"{i}, 16549220000{i:02d}, GPU-00000000-0000-0000-0000-{i:012d}"
             for i in range(8) if i != 3]
    if gpu3 is not None:
        lines.insert(3, f"3, {gpu3.serial or '[N/A]'}, {gpu3.uuid}")
    return "\n".join(lines) + "\n"


class Dcgm:
    """A PrometheusBackend over gpu02's dcgm-exporter: GPU 3's identity now (None: off the
    bus) and the last seen within the lookback."""

    def __init__(self, now: GpuIdentity | None, last_seen: GpuIdentity | None = None) -> None:
        self.now, self.last_seen = now, last_seen or now
        self.down: PrometheusError | None = None

    def query(self, promql: str, at: datetime | float | None = None, *,
              timeout: float | None = None) -> list[Sample]:
        if self.down:
            raise self.down
        if not promql.startswith(("DCGM_FI_DEV_GPU_TEMP", "last_over_time(")):
            return [Sample({"Hostname": "gpu02", "gpu": "0",
                            "__name__": "DCGM_EXP_XID_ERRORS_COUNT"}, 0.0)]
        which = self.last_seen if promql.startswith("last_over_time(") else self.now
        if 'hostname="' in promql:  # the newer label: this exporter uses the older one
            return []
        wanted = re.search(r'gpu="(\d+)"', promql)
        gpus = [int(wanted.group(1))] if wanted else list(range(8))
        found = []
        for g in gpus:
            identity = which if g == 3 else GpuIdentity(f"GPU-{g}", "")
            if identity is not None:
                found.append(Sample({"Hostname": "gpu02", "gpu": str(g), "UUID": identity.uuid,
                                     "DCGM_FI_DEV_SERIAL": identity.serial}, 40.0))
        return found

    def query_range(self, promql: str, start: datetime | float, end: datetime | float,
                    step: float | str, *, timeout: float | None = None) -> list[Series]:
        raise NotImplementedError

    def ready(self, *, timeout: float | None = None) -> bool:
        return True

    def alerts(self, *, timeout: float | None = None) -> list[dict[str, Any]]:
        return []


def ctx(earlier: Mapping[str, Any] | None = None) -> ActionContext:
    return ActionContext(execution_id=7, step_id="health-check", deadline=time.monotonic() + 30,
                         earlier=lambda step: earlier if step == "identity-before" else None)


# -- the reading before the swap ------------------------------------------------------------

def before(dcgm: Dcgm) -> Any:
    action = GpuIdentityAction(dcgm, PrometheusConfig(url="http://prometheus:9090"))
    return action.run(IdentityArguments(node="gpu02", gpu=3), ctx())


def test_before_the_swap_dcgm_names_the_gpu_now() -> None:
    result = before(Dcgm(OLD))
    assert result.details["before"] == [OLD.as_dict()] and result.details["when"] == "now"
    assert not result.changed


def test_a_gpu_off_the_bus_is_named_by_what_dcgm_last_saw() -> None:
    result = before(Dcgm(None, last_seen=OLD))
    assert result.details["before"] == [OLD.as_dict()]
    assert result.details["when"] == "last seen within 1d"


def test_a_series_without_the_serial_label_beside_one_with_it_is_one_gpu() -> None:
    dcgm = Dcgm(OLD)
    plain = Dcgm(GpuIdentity(OLD.uuid, ""))
    both = type("Both", (), {"query": lambda self, q, **kw: dcgm.query(q) + plain.query(q)})()
    assert dcgm_identities(both, "gpu02", 3) == [OLD]


def test_a_gpu_dcgm_never_saw_fails_before_anything_changes() -> None:
    with pytest.raises(ActionError, match="nothing to tell a replacement from it by"):
        before(Dcgm(None, last_seen=None))
    broken = Dcgm(OLD)
    broken.down = PrometheusError("connection refused")
    with pytest.raises(ActionError, match="cannot read GPU 3 of gpu02 from Prometheus"):
        before(broken)


# -- nvidia-smi and the verdict -------------------------------------------------------------

def test_nvidia_smi_lines_by_index() -> None:
    found = parse_identities(smi(NEW) + "garbage line\n")
    assert found[3] == NEW and len(found) == 8
    assert parse_identities("3, [N/A], GPU-abc\n")[3] == GpuIdentity("GPU-abc", "")


@pytest.mark.parametrize(("after", "dcgm", "verdict"), [
    (NEW, [NEW], None),
    (OLD, [OLD], "GPU 3 still reports UUID GPU-1a2b"),
    (GpuIdentity("GPU-other", OLD.serial), [GpuIdentity("GPU-other", OLD.serial)],
     "still reports UUID GPU-other, serial 1654922012345, as before the swap"),
    (NEW, [OLD], "nvidia-smi reads GPU 3 as UUID GPU-9f8e"),
    (None, [NEW], "nvidia-smi lists no GPU 3"),
])
def test_the_verdict(after: GpuIdentity | None, dcgm: list[GpuIdentity],
                     verdict: str | None) -> None:
    found = swap_verdict(3, [OLD], after, dcgm)
    assert found == verdict if verdict is None else verdict in (found or "")


def test_no_reading_from_before_is_no_evidence() -> None:
    assert "no reading of GPU 3 from before the swap" in (swap_verdict(3, [], NEW, [NEW]) or "")


# -- inside the health check ----------------------------------------------------------------

class Node(FakeSlurm):
    def __init__(self, gpu3: GpuIdentity | None) -> None:
        super().__init__(["gpu01", "gpu02"])
        self.gpu3 = gpu3

    def run_on_node(self, node: str, reservation: str | None, argv: list[str],
                    timeout: float, env: Mapping[str, str] | None = None
                    ) -> tuple[int, str, str]:
        if IDENTITY in argv:
            return 0, smi(self.gpu3), ""
        return super().run_on_node(node, reservation, argv, timeout, env)


def check(node_says: GpuIdentity | None, dcgm_says: GpuIdentity | None) -> tuple[Any, ...]:
    slurm = Node(node_says)
    slurm.update_nodes(["gpu02"], "DRAIN", "swap GPU 3: XID 79 (execution 7)")
    slurm.create_reservation("swap-gpu02", ["gpu02"], "now", 3600, ["MAINT"], ["root"])
    action = HealthCheckAction(slurm, CONFIG, lambda s: None, prometheus=Dcgm(dcgm_says),
                               gpu_settle=0.0)
    args = HealthCheckArguments.model_validate({
        "node": "gpu02", "reservation": "swap-gpu02", "gpu_telemetry": False,
        "identity_gpu": 3, "identity_before": "identity-before"})
    return action, slurm, args


def test_a_replaced_gpu_passes_and_the_evidence_is_in_the_result() -> None:
    action, slurm, args = check(NEW, NEW)
    result = action.run(args, ctx({"before": [OLD.as_dict()]}))
    assert "DRAIN" not in slurm.state["gpu02"].flags
    assert result.summary.endswith(f"GPU 3 replaced: {OLD.show()} -> {NEW.show()}")
    assert result.details["swap_evidence"] == {
        "gpu": 3, "before": [OLD.as_dict()], "after": NEW.as_dict(), "dcgm": [NEW.as_dict()]}
    assert any("must be DCGM's and not those step identity-before read" in line
               for line in action.plan(args))


@pytest.mark.parametrize(("node_says", "dcgm_says", "earlier", "verdict"), [
    (OLD, OLD, {"before": [OLD.as_dict()]}, "it was not replaced"),
    (NEW, OLD, {"before": [OLD.as_dict()]}, "but DCGM reports UUID GPU-1a2b"),
    (None, NEW, {"before": [OLD.as_dict()]}, "nvidia-smi lists no GPU 3"),
    (NEW, NEW, None, "no reading of GPU 3 from before the swap"),
])
def test_no_evidence_leaves_the_node_drained_with_the_verdict(
        node_says: GpuIdentity | None, dcgm_says: GpuIdentity, earlier: Any,
        verdict: str) -> None:
    action, slurm, args = check(node_says, dcgm_says)
    with pytest.raises(ActionError, match="gpu02 is left drained with that reason"):
        action.run(args, ctx(earlier))
    node = slurm.state["gpu02"]
    assert "DRAIN" in node.flags and node.reason.startswith("GPU swap: ")
    assert verdict in node.reason and node.reason.endswith("(execution 7: failed check)")
