"""The version of an installed Python package, read from its source without importing it
(the quick reads name their client library's version in their User-Agent)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path


def package_version(package: str, module_file: str = "__init__.py") -> str:
    """``__version__`` of an installed package, read from its source file without importing
    it (importing kubernetes or requests, or importlib.metadata, costs a quick command more
    than the command itself); "unknown" when it cannot be read."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return "unknown"
    try:
        text = (Path(spec.origin).parent / module_file).read_text(encoding="utf-8")
    except OSError:
        return "unknown"
    found = re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", text, re.MULTILINE)
    return found.group(1) if found else "unknown"
