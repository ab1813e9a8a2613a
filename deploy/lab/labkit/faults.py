"""Per-node faults as small JSON files under $LAB/faults/, plus the fake tools."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from . import gpufaults
from .layout import DEFAULT_DRIVER, Info, LabError, Layout

FAKE_TOOLS = Path(__file__).resolve().parent.parent / "labbin" / "fakegpu.py"
TOOL_NAMES = ["dcgmi", "nvidia-smi", "lab-driver-install", "lab-reboot", "nvidia-mig-parted",
              "all_reduce_perf"]
NHC_SCRIPT = Path(__file__).resolve().parents[2] / "nhc" / "gpu-health-check"
NHC_PROGRAM = "lab-nhc"
NHC_INTERVAL = 15  # seconds: slurm.conf's HealthCheckInterval
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LAB_COMMAND = Path(__file__).resolve().parent.parent / "lab"
CHOICES = {"health": {"pass", "fail"}, "nhc": {"pass", "fail"}, "api": {"500", "hang", "ok"},
           "upgrade": {"fail", "ok"}, "reset": {"fail", "ok"},
           "mig": {"fail", "ok"}, "reboot": {"hang", "ok"}, "install": {"fail", "ok"},
           "nccl": {"slow", "socket", "ok"}}


def install_tools(layout: Layout) -> None:
    target = layout.bin / "fakegpu.py"
    shutil.copyfile(FAKE_TOOLS, target)
    target.chmod(0o755)
    nhc = layout.bin / NHC_PROGRAM
    nhc.write_text(nhc_program(layout))
    nhc.chmod(0o755)
    (layout.bin / ".lab-command").write_text(str(LAB_COMMAND) + "\n")  # for lab-reboot
    for name in TOOL_NAMES:
        link = layout.bin / name
        if not link.is_symlink():
            link.symlink_to("fakegpu.py")


def nhc_program(layout: Layout) -> str:
    """slurm.conf's HealthCheckProgram: the shipped gpu-health-check, its GPU check the lab's
    dcgmi judged by the `nhc` fault. slurmd runs it with SLURMD_NODENAME and nothing else
    (no PATH, no SLURM_CONF); chrooted (lab up --slurm 24.11) PATH finds the root's own
    scontrol, and the lab's folder and the checkout are at their own paths there."""
    return f"""#!/bin/sh
export PATH={SYSTEM_PATH} SLURM_CONF={layout.slurm_conf} CONFIG=/dev/null
export LAB_HEALTH_FAULT=nhc GPU_CHECK="{layout.bin}/dcgmi diag -r 1"
exec /bin/sh {NHC_SCRIPT}
"""


def fault_file(layout: Layout, node: str) -> Path:
    return layout.faults / f"{node}.json"


def read(layout: Layout, node: str) -> Info:
    try:
        data: Info = json.loads(fault_file(layout, node).read_text())
    except (OSError, ValueError):
        return {}
    return data


def parse(pairs: list[str]) -> dict[str, str]:
    updates: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise LabError(f"expected key=value, got {pair!r}")
        allowed = CHOICES.get(key)
        if allowed and value not in allowed:
            raise LabError(f"{key} must be one of {sorted(allowed)}")
        gpufaults.validate(key, value)  # GPU telemetry keys: numbers in range
        if key == "nccl_seconds" and not (value.isdigit() and int(value) <= 600):
            raise LabError(f"nccl_seconds must be whole seconds up to 600, got {value!r}")
        updates[key] = value
    return updates


def apply(layout: Layout, node: str, pairs: list[str]) -> Info:
    """Merge key=value pairs into the node's faults; `clear` removes them."""
    if pairs == ["clear"]:
        fault_file(layout, node).unlink(missing_ok=True)
        return {}
    updates = parse(pairs)
    data = gpufaults.count_xid(read(layout, node) | updates | {"node": node}, updates)
    layout.faults.mkdir(parents=True, exist_ok=True)
    tmp = layout.faults / f".{node}.json.{os.getpid()}"
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(fault_file(layout, node))
    return data


def swap(layout: Layout, node: str, gpu: int) -> Info:
    """A technician replaced GPU ``gpu``: one more swap in the node's fault file
    (``swaps``: "GPU" -> count), so nvidia-smi and the DCGM simulator report a new serial and
    UUID for it. `lab fault NODE clear` (and `lab reset`) put the original GPU back."""
    data = read(layout, node)
    raw = data.get("swaps")
    swaps = dict(raw) if isinstance(raw, dict) else {}
    swaps[str(gpu)] = int(swaps.get(str(gpu), 0)) + 1
    data = data | {"node": node, "swaps": swaps}
    layout.faults.mkdir(parents=True, exist_ok=True)
    tmp = layout.faults / f".{node}.json.{os.getpid()}"
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(fault_file(layout, node))
    return data


def driver(layout: Layout, node: str) -> str:
    return str(read(layout, node).get("driver", DEFAULT_DRIVER))
