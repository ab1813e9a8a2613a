"""MIG in the lab's Slurm: the layouts (written as nvidia-mig-parted's config), each node's
layout (`$LAB/state/mig/<node>`, written by the fake `nvidia-mig-parted apply`) and the
gres.conf / slurm.conf node lines that follow it (`lab mig-reload NODE`)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from .layout import GPU_TYPE, GPUS_PER_NODE, Layout

DISABLED = "all-disabled"
# devices per GPU; the lab's bot.yaml (mig.layouts) and kubeapi/mig.py list the same
LAYOUTS: dict[str, dict[str, int]] = {
    DISABLED: {}, "all-3g.40gb": {"3g.40gb": 2}, "all-1g.10gb": {"1g.10gb": 7}}
MAX_MIG_DEVICES = 7 * GPUS_PER_NODE


def config_file(layout: Layout) -> Path:
    return layout.etc / "mig-parted.yaml"


def write_config(layout: Layout) -> None:
    """nvidia-mig-parted's config file (JSON is YAML): what the fake tool applies."""
    configs = {name: [{"devices": "all", "mig-enabled": bool(devices),
                       **({"mig-devices": devices} if devices else {})}]
               for name, devices in LAYOUTS.items()}
    config_file(layout).write_text(json.dumps({"version": "v1", "mig-configs": configs},
                                              indent=2) + "\n")
    for i in range(MAX_MIG_DEVICES):
        link = layout.dev / f"nvidia-mig{i}"
        if not link.is_symlink():
            link.symlink_to("/dev/null")


def node_layouts(layout: Layout, nodes: list[str]) -> dict[str, str]:
    """Each node's layout (all-disabled unless its state file says otherwise)."""
    found = {}
    for node in nodes:
        try:
            name = json.loads((layout.state / "mig" / node).read_text())["layout"]
        except (OSError, ValueError, KeyError, TypeError):
            name = DISABLED
        found[node] = name if name in LAYOUTS else DISABLED
    return found


def gres(name: str) -> list[tuple[str, int]]:
    """(type, count) of one node's GPUs under a layout: h100 x8, or the MIG devices."""
    devices = LAYOUTS[name]
    if not devices:
        return [(GPU_TYPE, GPUS_PER_NODE)]
    return [(profile, n * GPUS_PER_NODE) for profile, n in sorted(devices.items())]


def _ranges(values: list[int], width: int = 0) -> str:
    """``[1-2,4-5]`` (zero-padded to ``width``); a single value without brackets."""
    runs: list[list[int]] = []
    for value in sorted(values):
        if runs and value == runs[-1][1] + 1:
            runs[-1][1] = value
        else:
            runs.append([value, value])
    text = ",".join(f"{a:0{width}d}" if a == b else f"{a:0{width}d}-{b:0{width}d}"
                    for a, b in runs)
    return text if len(values) == 1 else f"[{text}]"


def hostlist(names: list[str]) -> str:
    """gpu01..gpuNN with gaps: gpu[01-02,04-05]."""
    return "gpu" + _ranges([int(n[3:]) for n in names], len(names[0]) - 3)


def slurm_node_lines(layout: Layout, nodes: list[str], port_of: dict[str, int],
                     hardware: str) -> list[str]:
    """NodeName lines: one for the nodes on the plain layout, one per MIG node."""
    layouts = node_layouts(layout, nodes)
    plain = [n for n in nodes if layouts[n] == DISABLED]
    lines = []
    for group in [*_port_groups(plain, port_of)] + [[n] for n in nodes
                                                    if layouts[n] != DISABLED]:
        spec = ",".join(f"gpu:{t}:{c}" for t, c in gres(layouts[group[0]]))
        ports = _ranges(sorted({port_of[n] for n in group}))
        lines.append(f"NodeName={hostlist(group)} NodeAddr=127.0.0.1 Port={ports} "
                     f"{hardware.replace(f'Gres=gpu:{GPU_TYPE}:{GPUS_PER_NODE}', f'Gres={spec}')}")
    return lines


def _port_groups(plain: list[str], port_of: dict[str, int]) -> list[list[str]]:
    """Nodes with a port of their own, then (scale labs) the nodes that share one port
    because they never run slurmd: Slurm wants one port, or one per node, per line."""
    uses = Counter(port_of[n] for n in plain)
    own = [n for n in plain if uses[port_of[n]] == 1]
    shared: dict[int, list[str]] = {}
    for n in plain:
        if uses[port_of[n]] > 1:
            shared.setdefault(port_of[n], []).append(n)
    return [g for g in (own, *shared.values()) if g]


def slurm_gres(layout: Layout, node: str) -> str:
    """The node's Gres= as slurm.conf now says: gpu:3g.40gb:16."""
    name = node_layouts(layout, [node])[node]
    return ",".join(f"gpu:{t}:{c}" for t, c in gres(name))


def gres_lines(layout: Layout, nodes: list[str]) -> list[str]:
    layouts = node_layouts(layout, nodes)
    plain = [n for n in nodes if layouts[n] == DISABLED]
    lines = []
    if plain:
        lines.append(f"NodeName={hostlist(plain)} Name=gpu Type={GPU_TYPE} "
                     f"File={layout.dev}/nvidia[0-{GPUS_PER_NODE - 1}]")
    for node in (n for n in nodes if layouts[n] != DISABLED):
        first = 0
        for profile, count in gres(layouts[node]):
            lines.append(f"NodeName={node} Name=gpu Type={profile} "
                         f"File={layout.dev}/nvidia-mig[{first}-{first + count - 1}]")
            first += count
    return lines
