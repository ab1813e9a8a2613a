"""What the simulated dcgm-exporter reports for one node: names, types, labels and values.

Names, HELP texts, types and labels follow NVIDIA's dcgm-exporter (etc/default-counters.csv
and the exporter's own DCGM_EXP_* fields). Values are deterministic per node and GPU, and
the node's fault file ($LAB/faults/<node>.json, written by `lab fault`) changes them; it is
read on every scrape, so faults take effect at the next scrape.

Fault keys (all optional):
  xid=N [xid_gpu=G]   last XID on GPU G (default: `gpu`, else 0) and one more XID event;
                      `lab fault` keeps the per-GPU, per-XID event counts in `xid_counts`
  ecc_dbe=N           double-bit volatile ECC total on GPU `gpu` (default 0)
  row_remap_failure=1 row remapping failed on GPU `gpu`
  remapped_rows=N     rows remapped for uncorrectable errors on GPU `gpu`
  temp=T              temperature of GPU `gpu` (every GPU when `gpu` is not set)
  util=U              utilisation of every GPU (power and memory follow it)
  gpu_missing=G[,G]   those GPUs' series disappear (fallen off the bus)
  exporter=down       the node's endpoint answers 503 and the node is left out of /metrics
  driver=VERSION      the DCGM_FI_DRIVER_VERSION label
  vbios=VERSION       the DCGM_FI_DEV_VBIOS_VERSION label of every GPU of the node (default
                      VBIOS); the InfoROM image (DCGM_FI_DEV_INFOROM_IMAGE_VER) is INFOROM
  swaps={"G": N}      `lab swap NODE G`: GPU G was replaced N times; its UUID and
                      DCGM_FI_DEV_SERIAL labels follow (as deploy/lab/labbin/fakegpu.py's)
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODEL = "NVIDIA H100 80GB HBM3"
FB_TOTAL_MIB = 81559
# An HGX H100 board's PCI bus ids, GPU 0..7.
PCI_BUSES = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]
XID_WINDOW_MS = "300000"  # dcgm-exporter's default --xid-count-window-size (5 minutes)
# Field values dcgm-exporter adds as labels when its counters CSV lists them as `label`.
VBIOS = "96.00.89.00.01"
INFOROM = "G520.0200.00.05"

# name -> (type, help) in the order dcgm-exporter prints them.
METRICS: dict[str, tuple[str, str]] = {
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered."),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("counter", "Total number of double-bit volatile ECC "
                                      "errors."),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("counter", "Number of remapped rows for "
                                                "uncorrectable errors"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gauge", "Whether remapping of rows has failed"),
    # dcgm-exporter's own field: a gauge (count within a window), one series per XID seen.
    "DCGM_EXP_XID_ERRORS_COUNT": ("gauge", "Count of XID Errors within user-specified time "
                                  "window (see xid-count-window-size param)."),
}


@dataclass(frozen=True)
class Gpu:
    node: str
    index: int
    driver: str
    vbios: str = VBIOS
    swap: int = 0  # times this GPU was replaced (`lab swap`)

    def labels(self) -> list[tuple[str, str]]:
        return [
            ("gpu", str(self.index)),
            ("UUID", gpu_uuid(self.node, self.index, self.swap)),
            ("pci_bus_id", f"00000000:{PCI_BUSES[self.index % len(PCI_BUSES)]}:00.0"),
            ("device", f"nvidia{self.index}"),
            ("modelName", MODEL),
            ("Hostname", self.node),
            ("hostname", self.node),  # newer dcgm-exporter releases; clients accept both
            ("DCGM_FI_DRIVER_VERSION", self.driver),
            ("DCGM_FI_DEV_VBIOS_VERSION", self.vbios),
            ("DCGM_FI_DEV_INFOROM_IMAGE_VER", INFOROM),
            ("DCGM_FI_DEV_SERIAL", gpu_serial(self.node, self.index, self.swap)),
        ]


def digest(*parts: object) -> bytes:
    return hashlib.sha256("/".join(map(str, parts)).encode()).digest()


def gpu_uuid(node: str, index: int, swap: int = 0) -> str:
    """The GPU's UUID; a replaced GPU (``swap`` > 0) has another one."""
    h = digest("uuid", node, index, *([swap] if swap else [])).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def gpu_serial(node: str, index: int, swap: int = 0) -> str:
    """The board's 13-digit serial number, as nvidia-smi prints it."""
    return "1654" + str(int.from_bytes(digest("serial", node, index, swap)[:8], "big"))[:9]


def swaps_of(fault: dict[str, Any]) -> dict[int, int]:
    raw = fault.get("swaps")
    return {int(k): int(v) for k, v in raw.items()} if isinstance(raw, dict) else {}


def default_util(node: str, index: int) -> int:
    """Deterministic 35..90 per GPU."""
    return 35 + digest("util", node, index)[0] % 56


def read_faults(faults_dir: Path | None, node: str) -> dict[str, Any]:
    if faults_dir is None:
        return {}
    try:
        data = json.loads((faults_dir / f"{node}.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _int(data: dict[str, Any], key: str, default: int = 0) -> int:
    try:
        return int(float(data.get(key, default)))
    except (TypeError, ValueError):
        return default


def _ints(value: Any) -> set[int]:
    out = set()
    for part in str(value if value is not None else "").split(","):
        if part.strip().lstrip("-").isdigit():
            out.add(int(part))
    return out


def exporter_down(fault: dict[str, Any]) -> bool:
    return str(fault.get("exporter", "")) == "down"


def xid_counts(fault: dict[str, Any]) -> dict[tuple[int, int], int]:
    """(gpu, xid) -> events. `lab fault` keeps them in `xid_counts` ("gpu:xid": n); a
    fault file written by hand with only `xid` counts as one event."""
    counts: dict[tuple[int, int], int] = {}
    raw = fault.get("xid_counts")
    if isinstance(raw, dict):
        for key, value in raw.items():
            gpu, _, xid = str(key).partition(":")
            if gpu.isdigit() and xid.isdigit():
                counts[(int(gpu), int(xid))] = int(value)
    xid = _int(fault, "xid")
    if xid and not counts:
        counts[(xid_gpu(fault), xid)] = 1
    return counts


def xid_gpu(fault: dict[str, Any]) -> int:
    return _int(fault, "xid_gpu", _int(fault, "gpu", 0))


def fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.3f}"


def samples(gpu: Gpu, fault: dict[str, Any]) -> list[tuple[str, list[tuple[str, str]], str]]:
    """(metric, labels, value) for one GPU."""
    node, i = gpu.node, gpu.index
    target = _int(fault, "gpu", 0)
    util = _int(fault, "util", default_util(node, i)) if "util" in fault \
        else default_util(node, i)
    jitter = digest("temp", node, i)[0] % 6
    temp: float = 30 + util * 0.3 + jitter
    if "temp" in fault and ("gpu" not in fault or target == i):
        temp = float(fault["temp"])
    power = 70 + util * 6.2 + jitter * 1.5
    fb_used = 0 if util == 0 else min(FB_TOTAL_MIB, 2000 + util * 850 + jitter * 10)
    xid = _int(fault, "xid") if xid_gpu(fault) == i else 0
    on_target = target == i
    base = gpu.labels()
    rows = [
        ("DCGM_FI_DEV_GPU_TEMP", base, fmt(round(temp))),
        ("DCGM_FI_DEV_POWER_USAGE", base, f"{power:.3f}"),
        ("DCGM_FI_DEV_GPU_UTIL", base, fmt(util)),
        ("DCGM_FI_DEV_FB_FREE", base, fmt(FB_TOTAL_MIB - fb_used)),
        ("DCGM_FI_DEV_FB_USED", base, fmt(fb_used)),
        ("DCGM_FI_DEV_XID_ERRORS", base, fmt(xid)),
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", base,
         fmt(_int(fault, "ecc_dbe") if on_target else 0)),
        ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", base,
         fmt(_int(fault, "remapped_rows") if on_target else 0)),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", base,
         fmt(1 if on_target and _int(fault, "row_remap_failure") else 0)),
    ]
    for (g, code), count in sorted(xid_counts(fault).items()):
        if g == i:
            labels = [*base, ("window_size_in_ms", XID_WINDOW_MS), ("xid", str(code))]
            rows.append(("DCGM_EXP_XID_ERRORS_COUNT", labels, fmt(count)))
    return rows


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(nodes: list[str], faults_dir: Path | None, default_driver: str,
           gpus: int = 8) -> str:
    """The /metrics page (Prometheus text format 0.0.4) for the given nodes."""
    by_metric: dict[str, list[str]] = {name: [] for name in METRICS}
    for node in nodes:
        fault = read_faults(faults_dir, node)
        if exporter_down(fault):
            continue
        missing = _ints(fault.get("gpu_missing"))
        driver = str(fault.get("driver", default_driver))
        vbios = str(fault.get("vbios") or VBIOS)
        for i in range(gpus):
            if i in missing:
                continue
            gpu = Gpu(node, i, driver, vbios, swaps_of(fault).get(i, 0))
            for name, labels, value in samples(gpu, fault):
                text = ",".join(f'{k}="{escape(v)}"' for k, v in labels)
                by_metric[name].append(f"{name}{{{text}}} {value}")
    lines = []
    for name, (kind, help_text) in METRICS.items():
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *by_metric[name]]
    return "\n".join(lines) + "\n"
