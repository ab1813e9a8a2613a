"""The surfaces (CLI, chat, Slack, console) read through the store's query functions and the
service's methods, never its tables (issue 30): no module under bot/surfaces/ imports
bot.store.schema or SQLAlchemy, so none can name a table or build a statement. The imports
are read with ast (inside functions and ``if TYPE_CHECKING:`` too); a failure names the module.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SURFACES = ROOT / "bot" / "surfaces"
FORBIDDEN = ("bot.store.schema", "sqlalchemy")


def imported(source: str, package: str) -> set[str]:
    """Every module ``source`` (a module of ``package``) imports, by its dotted name
    (``from a import b``: a and a.b)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def forbidden_imports(source: str, package: str) -> list[str]:
    return sorted(name for name in imported(source, package)
                  if any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN))


def package_of(path: Path) -> str:
    """The package relative imports in ``path`` start from (a package's own, for __init__)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1])


def test_no_surface_imports_the_tables_or_sqlalchemy() -> None:
    bad = {str(path.relative_to(ROOT)): forbidden_imports(path.read_text(), package_of(path))
           for path in sorted(SURFACES.rglob("*.py"))}
    bad = {module: names for module, names in bad.items() if names}
    assert not bad, ("surfaces read through bot.store's query functions or the service, "
                     f"not the tables: {bad}")


def test_the_check_sees_each_form_of_import() -> None:
    """The check is not blind: each way of writing the import is caught."""
    for line in ("import sqlalchemy", "from sqlalchemy.engine import Connection",
                 "from bot.store.schema import executions", "from bot.store import schema",
                 "from ...store import schema",
                 "if TYPE_CHECKING:\n    from sqlalchemy import Engine",
                 "def f():\n    from sqlalchemy import select"):
        assert forbidden_imports(line + "\n", "bot.surfaces.console"), line
    assert not forbidden_imports("from bot.store import queries\nfrom .. import rendering\n",
                                 "bot.surfaces.console")
