"""What an nccl-tests run said, and the verdict on it; pure, no I/O.

``parse`` reads all_reduce_perf's output: the bus bandwidth per size, the average, the GPUs
each host ran on, and, from NCCL's INFO lines (NCCL_DEBUG=INFO), the network each host used
(IB, with or without GPUDirect RDMA, or a fall back to sockets) and its IB ports' speeds.
``judge`` names the nodes a fall back, a missing GPU or a bandwidth under the baseline's
share points at, saying what the output cannot tell.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kit.hostlist import compress

_HEADER = re.compile(r"^# nThread (\d+) nGpus (\d+) minBytes (\d+) maxBytes (\d+) ")
# (nccl-tests before 2.13 print no Group)
_DEVICE = re.compile(r"^#\s+Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+"
                     r"\d+\s+\[[^\]]*\]\s+(.+?)\s*$")
_WRONG = re.compile(r"^# Out of bounds values\s*:\s*(\d+)")
_AVERAGE = re.compile(r"^# Avg bus bandwidth\s*:\s*([0-9.eE+-]+|nan|inf)")
# NCCL's debug prefix: HOST:PID:TID [CUDA device] NCCL INFO message (a launcher's tag, like
# mpirun's "[1,0]<stdout>:" or srun's "0: ", or a timestamp may lead)
_INFO = re.compile(r"([A-Za-z0-9_.-]+):(\d+):(\d+) \[(\d+)\] NCCL INFO (.*)$")
_SPEED = re.compile(r"^NET/IB\s*: \[(\d+)\] (\S+) .*\bspeed=(\d+)")
_VIA = re.compile(r"\bvia (\S+)")
_NUMBER = re.compile(r"^-?\d+(\.\d+)?([eE][+-]?\d+)?$")


class NcclOutputError(ValueError):
    """The output is not a finished all_reduce_perf run: the message says what is missing."""


@dataclass
class HostNet:
    """What NCCL's INFO lines say of one host's network."""

    network: str = ""  # "Using network IB" / "Using network Socket"
    no_ib: bool = False  # "NET/IB : No device found."
    socket: bool = False  # "NET/Socket : Using ...", or a channel via NET/Socket
    ib: bool = False  # "NET/IB : Using ...", or a channel via NET/IB
    gdrdma: bool = False  # a channel via NET/IB/N/GDRDMA
    net_channels: int = 0  # channels through the network (NET/...), not P2P or SHM
    speeds: dict[str, int] = field(default_factory=dict)  # IB port -> Mb/s (NET/IB: [0] ...)

    @property
    def fell_back(self) -> bool:
        return self.no_ib or self.socket or self.network.lower() == "socket"


@dataclass(frozen=True)
class SizeRow:
    size: int  # bytes
    busbw_out: float  # GB/s, out-of-place
    busbw_in: float  # GB/s, in-place


@dataclass(frozen=True)
class NcclRun:
    gpus_per_process: int
    max_bytes: int
    rows: tuple[SizeRow, ...]
    avg_busbw: float
    wrong: int  # "Out of bounds values"
    devices: Mapping[str, int]  # host -> GPUs it ran on ("# Using devices")
    models: frozenset[str]  # the GPUs' names
    hosts: Mapping[str, HostNet]  # host -> its INFO lines' network

    @property
    def busbw(self) -> float:
        """The bus bandwidth at the largest size (out-of-place and in-place averaged): the
        figure of the links, where the small sizes' average is mostly latency."""
        last = max(self.rows, key=lambda row: row.size)
        return round((last.busbw_out + last.busbw_in) / 2, 2)

    def summary(self) -> dict[str, object]:
        return {"busbw": self.busbw, "avg_busbw": self.avg_busbw, "max_bytes": self.max_bytes,
                "wrong": self.wrong, "devices": dict(self.devices),
                "models": sorted(self.models), "networks": networks(self.hosts),
                "busbw_by_size": {str(row.size): [row.busbw_out, row.busbw_in]
                                  for row in self.rows}}


def size_text(size: int) -> str:
    """1073741824 -> "1 GiB", as nccl-tests' -e takes it (1G); bytes when not whole."""
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if size >= unit and size % unit == 0:
            return f"{size // unit} {name}"
    return f"{size} B"


def networks(hosts: Mapping[str, HostNet]) -> dict[str, str]:
    """host -> "IB/GDRDMA", "IB", "Socket" (fell back), another network NCCL named (a plugin's)
    or "?", as the INFO lines tell."""
    return {host: "Socket" if net.fell_back else "IB/GDRDMA" if net.gdrdma
            else "IB" if net.ib else net.network or "?" for host, net in sorted(hosts.items())}


def parse_info(lines: Iterable[str]) -> dict[str, HostNet]:
    """Each host's network, from NCCL's INFO lines (any other line is ignored)."""
    hosts: dict[str, HostNet] = {}
    for line in lines:
        found = _INFO.search(line)
        if found is None:
            continue
        net = hosts.setdefault(found.group(1), HostNet())
        _read_info(net, found.group(5).strip())
    return hosts


def _read_info(net: HostNet, message: str) -> None:
    if message.startswith("Using network "):
        net.network = message[len("Using network "):]  # IB, Socket, a plugin's: IBext_v8
        net.ib |= net.network.lower().startswith("ib")
    elif message.startswith("NET/IB : No device found"):
        net.no_ib = True
    elif message.startswith("NET/Socket : Using"):
        net.socket = True
    elif message.startswith("NET/IB : Using"):
        net.ib = True
    elif (speed := _SPEED.match(message)) is not None:
        net.speeds[speed.group(2)] = int(speed.group(3))
    elif message.startswith("Channel ") and (via := _VIA.search(message)) is not None:
        path = via.group(1)
        if path.startswith("NET/"):
            net.net_channels += 1
            net.socket |= path.startswith("NET/Socket")
            net.ib |= path.startswith("NET/IB")
            net.gdrdma |= "/GDRDMA" in path


def parse(text: str) -> NcclRun:
    """The run of all_reduce_perf's output (its table and NCCL's INFO lines, in any order);
    NcclOutputError naming what is missing when the test did not run or finish."""
    lines = text.splitlines()
    header = next((m for m in map(_HEADER.match, lines) if m), None)
    rows = [row for row in map(_row, lines) if row is not None]
    average = next((m for m in map(_AVERAGE.match, lines) if m), None)
    wrong = next((m for m in map(_WRONG.match, lines) if m), None)
    missing = [what for what, found in (("the '# nThread ... nGpus ...' header", header),
                                        ("a result row", rows),
                                        ("the '# Avg bus bandwidth' line", average))
               if not found]
    if missing:
        shown = next((line.strip() for line in lines if line.strip()), "nothing")
        raise NcclOutputError(f"not an all_reduce_perf result: no {' and no '.join(missing)} "
                              f"(the output starts: {shown[:120]!r})")
    assert header is not None and average is not None
    devices: dict[str, int] = {}
    models: set[str] = set()
    for found in filter(None, map(_DEVICE.match, lines)):
        devices[found.group(2)] = devices.get(found.group(2), 0) + 1
        models.add(found.group(3))
    return NcclRun(int(header.group(2)), int(header.group(4)), tuple(rows),
                   _float(average.group(1)), int(wrong.group(1)) if wrong else 0, devices,
                   frozenset(models), parse_info(lines))


def _float(text: str) -> float:
    try:
        return round(float(text), 3)
    except ValueError:
        return 0.0


def _row(line: str) -> SizeRow | None:
    """``size count type redop root`` then time, algbw, busbw, #wrong out-of-place and the
    same in-place; None for any other line."""
    words = line.split()
    if len(words) < 13 or not words[0].isdigit() or not words[1].isdigit():
        return None
    numbers = words[5:13]
    if not all(_NUMBER.match(word) for i, word in enumerate(numbers) if i % 4 != 3):
        return None
    return SizeRow(int(words[0]), float(numbers[2]), float(numbers[6]))


@dataclass(frozen=True)
class Verdict:
    problems: tuple[str, ...]  # each names its nodes; none: passed
    nodes: tuple[str, ...]  # the nodes the problems point at
    notes: tuple[str, ...] = ()  # said, not failed (IB without GPUDirect RDMA)

    @property
    def passed(self) -> bool:
        return not self.problems


def judge_hosts(run_hosts: Mapping[str, HostNet], devices: Mapping[str, int],
                gpus: Mapping[str, int], multi: bool) -> Verdict:
    """Each node (``gpus``: node -> the GPUs it should run on, 0: not known) must have run
    on them, and its INFO lines must say IB, not sockets."""
    problems: list[str] = []
    named: list[str] = []
    notes: list[str] = []
    for node, expected in gpus.items():
        net = run_hosts.get(node)
        used = devices.get(node, 0)
        if expected and used != expected:
            problems.append(f"{node} ran the test on {used} GPU(s), not {expected}: a GPU "
                            "missing or not visible to CUDA")
            named.append(node)
        if net is None:
            problems.append(f"no NCCL INFO line from {node}: its network is unknown (NCCL "
                            "names hosts by their short hostname, which must be the Slurm "
                            "node name, and needs NCCL_DEBUG=INFO in the job step)")
            named.append(node)
        elif net.fell_back:
            said = "NET/IB : No device found, " if net.no_ib else ""
            problems.append(f"{node} fell back to sockets ({said}NCCL used NET/Socket): its "
                            "InfiniBand is not usable")
            named.append(node)
        elif multi and net.ib and not net.gdrdma:
            notes.append(f"{node} used IB without GPUDirect RDMA (no GDRDMA channel)")
    return Verdict(tuple(problems), tuple(dict.fromkeys(named)), tuple(notes))


def slow_nodes(hosts: Mapping[str, HostNet], nodes: list[str]) -> tuple[list[str], str]:
    """The nodes whose slowest IB port is slower than the other nodes' (NCCL prints port
    speeds with NCCL_DEBUG_SUBSYS=NET), with the evidence; ([], why not) when it cannot tell."""
    slowest = {node: min(hosts[node].speeds.values()) for node in nodes
               if node in hosts and hosts[node].speeds}
    if len(nodes) == 1:
        return list(nodes), f"the test ran on {nodes[0]} alone"
    if len(slowest) < len(nodes):
        return [], "NCCL printed no IB port speeds for some nodes"
    best = max(slowest.values())
    below = [node for node in nodes if slowest[node] < best]
    if not below:
        return [], (f"every node's IB ports report {best // 1000} Gb/s: NCCL's output does "
                    "not tell which node or link is slow")
    said = ", ".join(f"{node} {slowest[node] // 1000} Gb/s" for node in below)
    return below, f"IB ports slower than the others' {best // 1000} Gb/s: {said}"


def judge_bandwidth(run: NcclRun, nodes: list[str], baseline: float,
                    min_share: float) -> Verdict:
    """The largest size's bus bandwidth against ``min_share`` of ``baseline`` (GB/s)."""
    share = run.busbw / baseline if baseline > 0 else 1.0
    if share >= min_share:
        return Verdict((), ())
    suspects, evidence = slow_nodes(run.hosts, nodes)
    where = compress(nodes)
    blame = (f"likely {compress(suspects)} ({evidence})" if suspects and len(nodes) > 1
             else f"{where} ({evidence})" if suspects
             else f"one of {where} or a link between them ({evidence}; test them in pairs "
                  "with a known-good node to find it)")
    return Verdict((f"bus bandwidth {run.busbw:.1f} GB/s at {size_text(run.max_bytes)} across "
                    f"{where} is {share:.0%} of the baseline {baseline:.1f} GB/s (at least "
                    f"{min_share:.0%} needed): {blame}",), tuple(suspects or nodes))
