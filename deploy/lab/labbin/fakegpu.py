#!/usr/bin/env python3
"""Fake GPU tools for the lab: dcgmi, nvidia-smi and lab-driver-install.

Copied to $LAB/bin with one symlink per tool name; the name picks the tool.
The node comes from SLURMD_NODENAME (srun sets it) and its behaviour from
$LAB/faults/<node>.json, written by `deploy/lab/lab fault`.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import sys
from pathlib import Path
from typing import Any

LAB = Path(__file__).resolve().parent.parent
FAULTS = LAB / "faults"
HOST = Path("/.host/usr/bin")  # see reboot()
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_DRIVER = "535.161.08"
GPUS = 8
ROW = "| {:<25} | {:<46} |"
RULE = "+---------------------------+------------------------------------------------+"


def node() -> str:
    name = os.environ.get("SLURMD_NODENAME") or os.environ.get("LAB_NODE")
    if not name:
        sys.exit(f"{Path(sys.argv[0]).name}: no SLURMD_NODENAME: run me on a lab node via srun")
    return name


def faults(name: str) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((FAULTS / f"{name}.json").read_text())
        return data
    except (OSError, ValueError):
        return {}


def driver(name: str) -> str:
    return str(faults(name).get("driver", DEFAULT_DRIVER))


def section(title: str) -> str:
    return f"|-----  {title}  ".ljust(28, "-") + "+" + "-" * 48 + "|"


def dcgmi(args: list[str]) -> int:
    if not args or args[0] != "diag":
        if args[:2] == ["discovery", "-l"]:
            print(f"{GPUS} GPUs found.")
            for i in range(GPUS):
                print(f"| {i}      | Device Information: NVIDIA H100 80GB HBM3")
            return 0
        print("dcgmi (lab fake): only 'diag -r N' and 'discovery -l' are supported",
              file=sys.stderr)
        return 2
    name = node()
    fault = faults(name)
    failing = fault.get("health") == "fail"
    bad_gpu = int(fault.get("gpu", 3))
    memory = f"Fail - GPU: {bad_gpu}" if failing else "Pass - All"
    remap = f"Fail - GPU: {bad_gpu}" if failing else "Pass"
    lines = [
        "Successfully ran diagnostic for group.",
        RULE,
        ROW.format("Diagnostic", "Result"),
        RULE.replace("-", "="),
        section("Metadata"),
        ROW.format("DCGM Version", "3.3.5"),
        ROW.format("Driver Version Detected", driver(name)),
        ROW.format("GPU Device IDs Detected", ",".join(["2330"] * GPUS)),
        section("Deployment"),
        *(ROW.format(check, "Pass") for check in (
            "Denylist", "NVML Library", "CUDA Main Library", "Permissions and OS Blocks",
            "Persistence Mode", "Environment Variables")),
        ROW.format("Page Retirement/Row Remap", remap),
        ROW.format("Graphics Processes", "Pass"),
        ROW.format("Inforom", "Pass"),
        section("Integration"),
        ROW.format("PCIe", "Pass - All"),
        section("Hardware"),
        ROW.format("GPU Memory", memory),
    ]
    if failing:
        lines.append(ROW.format("Warning", f"GPU {bad_gpu} Row remap failure on {name}:"))
        lines.append(ROW.format("", "uncorrectable memory errors; drain the node"))
    lines.append(RULE)
    print("\n".join(lines))
    return 1 if failing else 0


def digest(*parts: object) -> bytes:
    return hashlib.sha256("/".join(map(str, parts)).encode()).digest()


def gpu_uuid(name: str, index: int, swap: int = 0) -> str:
    """The same UUID the DCGM simulator labels the GPU with (deploy/lab/dcgm/exporter.py)."""
    h = digest("uuid", name, index, *([swap] if swap else [])).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def gpu_serial(name: str, index: int, swap: int = 0) -> str:
    return "1654" + str(int.from_bytes(digest("serial", name, index, swap)[:8], "big"))[:9]


def gpu_values(name: str, index: int, version: str) -> dict[str, str]:
    raw = faults(name).get("swaps")
    swap = int(raw.get(str(index), 0)) if isinstance(raw, dict) else 0
    return {"driver_version": version, "name": "NVIDIA H100 80GB HBM3", "index": str(index),
            "serial": gpu_serial(name, index, swap), "uuid": gpu_uuid(name, index, swap)}


def present(name: str) -> list[int]:
    """The GPUs the driver sees: not those `gpu_missing` took off the bus."""
    raw = str(faults(name).get("gpu_missing", ""))
    missing = {int(g) for g in raw.split(",") if g.strip().isdigit()}
    return [i for i in range(GPUS) if i not in missing]


def nvidia_smi(args: list[str]) -> int:
    name = node()
    version = driver(name)
    shown = present(name)
    if "-i" in args[:-1]:  # one GPU: `-i N`
        wanted = args[args.index("-i") + 1]
        if not wanted.isdigit() or int(wanted) not in shown:
            print(f"No devices were found (GPU {wanted})", file=sys.stderr)
            return 6
        shown = [int(wanted)]
    if any(a.startswith("--query-gpu=") for a in args):
        fields = next(a for a in args if a.startswith("--query-gpu=")).split("=", 1)[1].split(",")
        for i in shown:
            values = gpu_values(name, i, version)
            print(", ".join(values.get(f.strip(), "[N/A]") for f in fields))
        return 0
    if "-L" in args:
        for i in shown:
            print(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: {gpu_values(name, i, version)['uuid']})")
        return 0
    if "-pm" in args or "-r" in args:
        return gpu_reset(args)
    print(f"NVIDIA-SMI {version}    Driver Version: {version}    CUDA Version: 12.4")
    return 0


PCI_BUSES = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]  # as deploy/lab/dcgm


def gpu_reset(args: list[str]) -> int:
    """`nvidia-smi -pm 0 -i N` and `nvidia-smi -r -i N`; the reset fails on `reset=fail`."""
    index = args[args.index("-i") + 1] if "-i" in args[:-1] else ""
    if not index.isdigit() or int(index) >= GPUS:
        print("No devices were found", file=sys.stderr)
        return 6
    bus = f"00000000:{PCI_BUSES[int(index)]}:00.0"
    if "-pm" in args:
        print(f"Disabled persistence mode for GPU {bus}.\nAll done.")
        return 0
    if faults(node()).get("reset") == "fail":
        print("Unable to reset this GPU because it's being used by some other process (e.g. "
              "CUDA application, graphics application like X server, monitoring application "
              "like other instance of nvidia-smi). Please first kill all processes using this "
              "GPU and all compute applications running in the system.", file=sys.stderr)
        return 255
    print(f"GPU {bus} was successfully reset.\nAll done.")
    return 0


def driver_install(args: list[str]) -> int:
    """The site's driver command in the lab: records VERSION for this node."""
    if len(args) != 1:
        print("usage: lab-driver-install VERSION", file=sys.stderr)
        return 2
    name = node()
    data = faults(name) | {"node": name, "driver": args[0]}
    FAULTS.mkdir(exist_ok=True)
    tmp = FAULTS / f".{name}.json.{os.getpid()}"
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(FAULTS / f"{name}.json")
    print(f"{name}: driver {args[0]} installed")
    return 0


def parent_node() -> str | None:
    """The node whose slurmd runs us (through a shell): `slurmd ... -N gpu04` up the tree."""
    pid = os.getppid()
    for _ in range(5):
        try:
            words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        for flag, value in itertools.pairwise(words):
            if flag == b"-N":
                return value.decode()
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # field 4: the parent's pid
    return None


def reboot(args: list[str]) -> int:
    """slurmd's RebootProgram in the lab: restart this node's slurmd as if it had booted.

    It returns at once; a detached child asks the lab to restart slurmd with -b
    (so slurmctld sees a reboot and applies nextstate=...).
    """
    import subprocess

    # 26.05 runs RebootProgram with SLURM_NODE_NAME set (and hardly anything else)
    name = (parent_node() or os.environ.get("SLURM_NODE_NAME")
            or os.environ.get("SLURMD_NODENAME"))
    if not name:
        print("lab-reboot: cannot tell which node to reboot", file=sys.stderr)
        return 1
    lab = (Path(__file__).resolve().parent / ".lab-command").read_text().strip()
    log = open(LAB / "log" / f"reboot-{name}.log", "ab")  # noqa: SIM115 - the child keeps it
    # A slurmd chrooted into a Debian root (lab up --slurm 24.11) sees the host at /.host:
    # the lab command runs there, with the host's Python.
    # Full paths and a PATH of its own: 26.05's slurmd runs RebootProgram with no PATH.
    python = (["/usr/sbin/chroot", "/.host", "/usr/bin/python3"] if HOST.is_dir()
              else [sys.executable])
    # and this lab's folder, said: without it the lab command would pick its default lab
    env = {**os.environ, "PATH": os.environ.get("PATH") or SYSTEM_PATH,
           "RUNBOOK_LAB_DIR": str(LAB)}
    subprocess.Popen(
        [*python, "-c", "import subprocess, sys, time; time.sleep(1); "
         "sys.exit(subprocess.call(sys.argv[1:]))", lab, "service", f"slurmd-{name}", "reboot"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, env=env,
    )
    return 0


def mig_parted(args: list[str]) -> int:
    """`nvidia-mig-parted apply -f CONFIG -c LAYOUT`: a layout of CONFIG (written by the lab)
    becomes this node's, in $LAB/state/mig/<node>; fails on `lab fault NODE mig=fail`.
    `lab mig-reload NODE` then makes gres.conf and slurm.conf follow it."""
    if args[:1] != ["apply"] or "-f" not in args[:-1] or "-c" not in args[:-1]:
        print("usage: nvidia-mig-parted apply -f CONFIG -c LAYOUT", file=sys.stderr)
        return 2
    wanted = args[args.index("-c") + 1]
    try:
        configs = json.loads(Path(args[args.index("-f") + 1]).read_text())["mig-configs"]
    except (OSError, ValueError, KeyError) as exc:
        print(f"error parsing the configuration file: {exc}", file=sys.stderr)
        return 1
    name = node()
    if wanted not in configs:
        print(f"error: unknown config {wanted!r} (known: {', '.join(sorted(configs))})",
              file=sys.stderr)
        return 1
    if faults(name).get("mig") == "fail":
        print(f"error applying MIG configuration {wanted} on {name}: "
              "GPU 0: in use by another client", file=sys.stderr)
        return 1
    state = LAB / "state" / "mig"
    state.mkdir(parents=True, exist_ok=True)
    tmp = state / f".{name}.{os.getpid()}"
    tmp.write_text(json.dumps({"node": name, "layout": wanted}) + "\n")
    tmp.replace(state / name)
    print(f"{name}: MIG configuration {wanted} applied")
    return 0


TOOLS = {"dcgmi": dcgmi, "nvidia-smi": nvidia_smi, "lab-driver-install": driver_install,
         "lab-reboot": reboot, "nvidia-mig-parted": mig_parted}

if __name__ == "__main__":
    tool = TOOLS.get(Path(sys.argv[0]).name)
    if tool is None:
        sys.exit(f"call me as one of {sorted(TOOLS)}")
    sys.exit(tool(sys.argv[1:]))
