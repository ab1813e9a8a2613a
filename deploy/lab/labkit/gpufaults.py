"""GPU telemetry fault keys of `lab fault` (read by the DCGM-exporter simulator, deploy/lab/dcgm).

Numbers are checked here so a typo fails the command instead of the scrape. Every
`xid=N` is one more XID event: its count is kept in the fault file (`xid_counts`,
"gpu:xid" -> events), which the simulator reports as DCGM_EXP_XID_ERRORS_COUNT{xid="N"}.
"""
from __future__ import annotations

import re

from .layout import GPUS_PER_NODE, Info, LabError

# key -> (lowest, highest) accepted value; every value an integer.
NUMERIC: dict[str, tuple[int, int]] = {
    "xid": (0, 1000),
    "xid_gpu": (0, GPUS_PER_NODE - 1),
    "gpu": (0, GPUS_PER_NODE - 1),
    "ecc_dbe": (0, 10**9),
    "remapped_rows": (0, 10**6),
    "row_remap_failure": (0, 1),
    "temp": (0, 200),
    "util": (0, 100),
}
LISTS = {"gpu_missing": (0, GPUS_PER_NODE - 1)}  # comma-separated GPU indices
CHOICES = {"exporter": {"down", "up"}}
VBIOS = re.compile(r"^[0-9A-F]{2}(\.[0-9A-F]{2}){4}$")  # 96.00.89.00.01


def _number(key: str, text: str, low: int, high: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise LabError(f"{key} must be an integer, got {text!r}") from None
    if not low <= value <= high:
        raise LabError(f"{key} must be between {low} and {high}, got {value}")
    return value


def validate(key: str, value: str) -> None:
    if key in NUMERIC:
        _number(key, value, *NUMERIC[key])
    elif key in LISTS:
        parts = value.split(",")
        if not all(parts):
            raise LabError(f"{key} must be GPU indices like 3 or 3,5, got {value!r}")
        for part in parts:
            _number(key, part, *LISTS[key])
    elif key in CHOICES and value not in CHOICES[key]:
        raise LabError(f"{key} must be one of {sorted(CHOICES[key])}")
    elif key == "vbios" and not VBIOS.match(value):
        raise LabError(f"vbios must be a VBIOS version like 96.00.89.00.01, got {value!r}")


def count_xid(data: Info, updates: dict[str, str]) -> Info:
    """One more event of the XID just set, on its GPU (xid_gpu, else gpu, else 0)."""
    xid = int(updates.get("xid", "0"))
    if xid:
        gpu = int(data.get("xid_gpu", data.get("gpu", 0)))
        raw = data.get("xid_counts")
        counts = dict(raw) if isinstance(raw, dict) else {}
        key = f"{gpu}:{xid}"
        counts[key] = int(counts.get(key, 0)) + 1
        data["xid_counts"] = counts
    return data
