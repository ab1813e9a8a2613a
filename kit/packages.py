"""An adapter package's names, imported on first use (PEP 562): importing one module of a
package (its config, kit.hostlist) then loads neither its actions nor its
clients, and a command starts in less time."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def exports(package: str, modules: Mapping[str, tuple[str, ...]]) -> Callable[[str], object]:
    """The ``__getattr__`` of ``package``: each name in ``modules`` (module -> names) comes
    from its module the first time it is asked for, and is kept in the package."""
    where = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> object:
        if name not in where:  # a submodule (``from kit import hostlist``) or a typo
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__


def package_version(package: str, module_file: str = "__init__.py") -> str:
    """``__version__`` of an installed package, read from its source file without importing
    it (importing kubernetes or requests, or importlib.metadata, costs a quick command more
    than the command itself); "unknown" when it cannot be read."""
    import importlib.util
    import re
    from pathlib import Path

    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return "unknown"
    try:
        text = (Path(spec.origin).parent / module_file).read_text(encoding="utf-8")
    except OSError:
        return "unknown"
    found = re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", text, re.MULTILINE)
    return found.group(1) if found else "unknown"
