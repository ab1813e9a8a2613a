#!/usr/bin/env python3
"""Fake GPU tools for the lab: dcgmi, nvidia-smi, lab-driver-install and all_reduce_perf.

Copied to $LAB/bin with one symlink per tool name; the name picks the tool.
The node comes from SLURMD_NODENAME (srun sets it) and its behaviour from
$LAB/faults/<node>.json, written by `deploy/lab/lab fault`.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import sys
import time
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
    # the lab's node health check (lab-nhc) runs this with LAB_HEALTH_FAULT=nhc: it then
    # fails on `lab fault NODE nhc=fail`, leaving `health` to the bot's own checks
    failing = fault.get(os.environ.get("LAB_HEALTH_FAULT") or "health") == "fail"
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


# --- all_reduce_perf (nccl-tests), output as nccl-tests 2.13-2.19 print it -----------------

NCCL_VERSION = "2.21.5+cuda12.4"
# healthy bus bandwidth at large sizes (GB/s) and the latency of one operation (us), by path
NCCL_PEAK = {"nvlink": 362.0, "ib": 189.0, "socket": 6.4}
NCCL_LATENCY = {"nvlink": 9.5, "ib": 21.0, "socket": 58.0}
NCCL_SLOW = 0.26  # `nccl=slow`: the share of the healthy bandwidth left (ports at 100 Gb/s)
IB_SPEED, SLOW_IB_SPEED = 400000, 100000  # Mb/s, as NCCL prints an IB port's speed
NCCL_CHANNELS = 4
NCCL_SUBSYS = {"INIT", "BOOTSTRAP", "ENV"}  # NCCL's default NCCL_DEBUG_SUBSYS
SIZE_UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3}


def expand_nodes(expression: str) -> list[str]:
    """A Slurm hostlist (gpu[01-02,04],gpu07) as srun sets SLURM_STEP_NODELIST."""
    names: list[str] = []
    for prefix, inner, plain in re.findall(r"([^,\[]*)\[([^\]]*)\]|([^,\[\]]+)", expression):
        if plain:
            names.append(plain)
            continue
        for part in inner.split(","):
            low, _, high = part.partition("-")
            names += [f"{prefix}{n:0{len(low)}d}" for n in range(int(low), int(high or low) + 1)]
    return names


def nccl_size(text: str) -> int:
    unit = SIZE_UNITS.get(text[-1:].upper(), 1)
    return int(text[:-1] if unit > 1 else text) * unit


def nccl_options(args: list[str]) -> dict[str, int]:
    """The options all_reduce_perf takes here: -b -e -f -i -g -t -n -w -c (others: usage)."""
    opts = {"b": 32 * 1024**2, "e": 32 * 1024**2, "f": 1, "i": 1024**2, "g": 1, "t": 1,
            "n": 20, "w": 5, "c": 1}
    words = list(args)
    while words:
        flag = words.pop(0)
        if not (len(flag) == 2 and flag[0] == "-" and flag[1] in opts and words):
            raise ValueError(flag)
        value = words.pop(0)
        opts[flag[1]] = nccl_size(value) if flag[1] in "bei" else int(value)
    return opts


def nccl_pid(host: str) -> int:
    return 1000 + int.from_bytes(digest("pid", host)[:4], "big") % 60000


def nccl_job() -> tuple[list[str], int, dict[str, str]]:
    """The job step's nodes (as srun sets them), this task's rank and each node's fault."""
    me = node()
    nodes = expand_nodes(os.environ.get("SLURM_STEP_NODELIST")
                         or os.environ.get("SLURM_JOB_NODELIST") or me)
    return nodes, int(os.environ.get("SLURM_PROCID", "0")), {
        n: str(faults(n).get("nccl", "ok")) for n in nodes}


def nccl_path(nodes: list[str], fault: dict[str, str]) -> tuple[str, float]:
    """The slowest path of the ring and the share of its bandwidth the faults leave."""
    path = "nvlink" if len(nodes) == 1 else (
        "socket" if "socket" in fault.values() else "ib")
    return path, NCCL_SLOW if "slow" in fault.values() else 1.0


def nccl_info(host: str, dev: int, message: str, subsys: str = "INIT") -> None:
    wanted = {s.strip().upper() for s in os.environ.get("NCCL_DEBUG_SUBSYS", "").split(",")
              if s.strip()} or NCCL_SUBSYS
    if os.environ.get("NCCL_DEBUG", "").upper() in ("INFO", "TRACE") and (
            "ALL" in wanted or set(subsys.split("|")) & wanted):
        pid = nccl_pid(host)
        print(f"{host}:{pid}:{pid} [{dev}] NCCL INFO {message}")


def nccl_network(host: str, index: int, fault: str) -> str:
    """What NCCL says of its network on ``host``; the name of the one it uses."""
    oob = f"eth0:10.0.0.{index + 1}<0>"
    if fault == "socket":
        nccl_info(host, 0, "NET/IB : No device found.", "INIT|NET")
        nccl_info(host, 0, f"NET/Socket : Using [0]{oob}", "INIT|NET")
        nccl_info(host, 0, "Using network Socket")
        return "Socket"
    speed = SLOW_IB_SPEED if fault == "slow" else IB_SPEED
    for d in range(GPUS):
        bus = PCI_BUSES[d].lower()
        nccl_info(host, 0, f"NET/IB: [{d}] mlx5_{d}:uverbs{d}:1/IB provider=Mlx5 speed={speed} "
                  f"context=0x55d{d}c8a0f0 pciPath=/sys/devices/pci0000:{bus}/0000:{bus}:01.0/"
                  f"0000:{bus}:00.1 ar=1 oooRqSize=0", "NET")
    ports = " ".join(f"[{d}]mlx5_{d}:1/IB" for d in range(GPUS))
    nccl_info(host, 0, f"NET/IB : Using {ports} [RO]; OOB {oob}", "INIT|NET")
    nccl_info(host, 0, "Using network IB")
    return "IB"


def nccl_channels(nodes: list[str], index: int, gpus: int, network: str) -> None:
    """This host's ring channels: NVLink between its GPUs, the network to the next node."""
    host, first = nodes[index], index * gpus
    total = len(nodes) * gpus
    for channel in range(NCCL_CHANNELS):
        ring = f"Channel {channel:02d}/0 : "
        for local in range(gpus - (1 if len(nodes) > 1 else 0)):
            peer = (local + 1) % gpus
            nccl_info(host, local, f"{ring}{first + local}[{local}] -> {first + peer}[{peer}] "
                      "via P2P/CUMEM/read", "INIT|P2P")
        if len(nodes) == 1:
            continue
        via = (f"NET/IB/{channel % GPUS}/GDRDMA" if network == "IB" else "NET/Socket/0")
        last = first + gpus - 1
        nccl_info(host, gpus - 1, f"{ring}{last}[{gpus - 1}] -> {(last + 1) % total}[0] "
                  f"[send] via {via}", "INIT|NET")
        nccl_info(host, 0, f"{ring}{(first - 1) % total}[{gpus - 1}] -> {first}[0] "
                  f"[receive] via {via}", "INIT|NET")


def nccl_init(nodes: list[str], rank: int, gpus: int, fault: dict[str, str]) -> None:
    """The INFO lines NCCL prints on this task's node (NCCL_DEBUG=INFO)."""
    host = nodes[rank]
    if rank == 0:
        nccl_info(host, 0, f"NCCL version {NCCL_VERSION}")
    nccl_info(host, 0, f"Bootstrap : Using eth0:10.0.0.{rank + 1}<0>", "BOOTSTRAP")
    nccl_info(host, 0, "cudaDriverVersion 12040")
    network = nccl_network(host, rank, fault[host])
    for local in range(gpus):
        nccl_info(host, local, f"comm 0x7f{rank:02x}{local:02x}c0 rank {rank * gpus + local} "
                  f"nRanks {len(nodes) * gpus} nNodes {len(nodes)} localRanks {gpus} "
                  f"localRank {local} MNNVL 0")
    nccl_channels(nodes, rank, gpus, network)
    nccl_info(host, 0, "Connected all rings")
    for local in range(gpus):
        nccl_info(host, local, f"comm 0x7f{rank:02x}{local:02x}c0 rank {rank * gpus + local} "
                  f"nranks {len(nodes) * gpus} cudaDev {local} nvmlDev {local} busId "
                  f"{PCI_BUSES[local].lower()}000 commId 0x5e1f2c3d4b5a6978 - Init COMPLETE")


def c(fmt: str, *values: object) -> str:
    """C's printf: nccl-tests' own formats, kept as its source (src/common.cu) writes them."""
    return fmt % values


def nccl_header(opts: dict[str, int], nodes: list[str]) -> None:
    print(f"# nThread {opts['t']} nGpus {opts['g']} minBytes {opts['b']} maxBytes {opts['e']} "
          f"step: {opts['f'] if opts['f'] > 1 else opts['i']}"
          f"({'factor' if opts['f'] > 1 else 'bytes'}) warmup iters: {opts['w']} iters: "
          f"{opts['n']} agg iters: 1 validation: {opts['c']} graph: 0")
    print("#\n# Using devices")
    for index, host in enumerate(nodes):
        for local in range(opts["g"]):
            print(c("#  Rank %2d Group %2d Pid %6d on %10s device %2d [0x%s] %s",
                    index * opts["g"] + local, 0, nccl_pid(host), host, local,
                    PCI_BUSES[local].lower(), "NVIDIA H100 80GB HBM3"))


def nccl_columns() -> None:
    """The table's header, printed once NCCL is initialised (after its INFO lines)."""
    print("#")
    print(c("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place"
            "          ", "", "", "", "", ""))
    print(c("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s",
            "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
            "time", "algbw", "busbw", "#wrong"))
    print(c("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s",
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
            "(GB/s)", ""))


def nccl_sizes(opts: dict[str, int]) -> list[int]:
    sizes, size = [], opts["b"]
    while size <= opts["e"]:
        sizes.append(size)
        size = size * opts["f"] if opts["f"] > 1 else size + opts["i"]
    return sizes


def nccl_table(opts: dict[str, int], ranks: int, path: str, share: float) -> float:
    """One row per size (time, algbw, busbw out-of-place then in-place) and the average;
    the seconds the run would take. Deterministic: a small jitter from the size's digest."""
    factor = 2 * (ranks - 1) / ranks if ranks > 1 else 1.0
    peak, latency = NCCL_PEAK[path] * share, NCCL_LATENCY[path]
    bus, seconds = [], 0.0
    for size in nccl_sizes(opts):
        print(c("%12li  %12li  %8s  %6s  %6s", size, size // 4, "float", "sum", c("%6i", -1)),
              end="")
        for place in (0, 1):
            jitter = 1 + (digest("nccl", size, place)[0] - 128) / 128 * 0.008
            usec = (latency + size * factor / (peak * 1e3)) * jitter
            algbw = size / usec / 1e3
            bus.append(algbw * factor)
            seconds += usec * (opts["n"] + opts["w"]) / 1e6
            shown = c("%7.0f" if usec >= 10000 else "%7.1f" if usec >= 100 else "%7.2f", usec)
            print(c("  %7s  %6.2f  %6.2f  %5g", shown, algbw, algbw * factor, 0), end="")
        print()
    print(c("# Out of bounds values : %d %s", 0, "OK"))
    print(c("# Avg bus bandwidth    : %g %s", sum(bus) / max(1, len(bus)), ""))
    print("#\n")
    return seconds


def all_reduce_perf(args: list[str]) -> int:
    """nccl-tests' all_reduce_perf as srun runs it, one task per node (-g GPUs each): task 0
    prints the table, every task NCCL's INFO lines for its node. Faults of any node of the
    job: `nccl=slow` (a quarter of the bandwidth; its IB ports at 100 Gb/s), `nccl=socket`
    (that node finds no IB device and NCCL falls back to sockets); `nccl_seconds=N` makes
    the run take N seconds (else the sizes' simulated time, at most 6 s)."""
    try:
        opts = nccl_options(args)
    except (ValueError, IndexError) as exc:
        print(f"invalid option {exc}\nUSAGE: all_reduce_perf -b MIN -e MAX -f FACTOR -g GPUS",
              file=sys.stderr)
        return 1
    nodes, rank, fault = nccl_job()
    path, share = nccl_path(nodes, fault)
    started = time.monotonic()
    if rank == 0:
        nccl_header(opts, nodes)
    sys.stdout.flush()
    nccl_init(nodes, rank, opts["g"], fault)
    sys.stdout.flush()
    seconds = 0.0
    if rank == 0:
        nccl_columns()
        seconds = nccl_table(opts, len(nodes) * opts["g"], path, share)
    wanted = max((float(faults(n).get("nccl_seconds", -1)) for n in nodes), default=-1)
    time.sleep(max(0.0, (wanted if wanted >= 0 else min(6.0, 1.2 + seconds))
                   - (time.monotonic() - started)))
    return 0


TOOLS = {"dcgmi": dcgmi, "nvidia-smi": nvidia_smi, "lab-driver-install": driver_install,
         "lab-reboot": reboot, "nvidia-mig-parted": mig_parted,
         "all_reduce_perf": all_reduce_perf}

if __name__ == "__main__":
    tool = TOOLS.get(Path(sys.argv[0]).name)
    if tool is None:
        sys.exit(f"call me as one of {sorted(TOOLS)}")
    sys.exit(tool(sys.argv[1:]))
