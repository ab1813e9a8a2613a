"""Version numbers of drivers and firmware (``550.54.15``), compared number by number."""

from __future__ import annotations


def version_key(version: str) -> tuple[int, ...] | None:
    """``"550.54.15"`` -> ``(550, 54, 15)``, so that 550.127.05 sorts after 550.54.15; None
    for a text that is not numbers and dots (it then compares as unequal only)."""
    try:
        return tuple(int(part) for part in version.split("."))
    except ValueError:
        return None
