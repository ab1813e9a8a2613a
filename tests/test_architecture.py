"""The shape the code keeps (docs/architecture.md): no function over 60 lines, module
docstrings of a few lines, every package and module of the core documented. The layers
themselves are import-linter's contracts (`make lint`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted(
    path for package in ("kit", "bot", "adapters") for path in (ROOT / package).rglob("*.py")
    if "migrations" not in path.parts)
MAX_FUNCTION_LINES = 60
MAX_MODULE_DOC_LINES = 8


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", SOURCES, ids=_name)
def test_functions_are_short_and_modules_say_what_they_are_for(path: Path) -> None:
    tree = ast.parse(path.read_text())
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno is not None
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"split these: {', '.join(long)}"
    doc = ast.get_docstring(tree, clean=False)
    if path.name != "__init__.py" or doc is not None:
        assert doc, "a module docstring: what the module is for and what it must not do"
        assert len(doc.splitlines()) <= MAX_MODULE_DOC_LINES, (
            "a few lines; the detail goes where it is used")


def test_the_scan_sees_the_code() -> None:
    assert len(SOURCES) > 100
    assert any(path.name == "engine.py" for path in SOURCES)
