"""docs/architecture.md names every module: each Python file of kit/, bot/ and adapters/ (but
package faces and migrations) is named in the package map, by its path or by its name in the
entry of its folder (``bot/store/  ... shipping.py (...)``; ``adapters/<system>/`` stands for
any one system, ``adapters/*.py`` for the modules directly in adapters/). A new module not on
the page fails here, naming it."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"


def package_map() -> list[tuple[str, str]]:
    """(head, text) of each entry of the page's package map: a line that starts at column 0
    opens an entry, indented lines continue it."""
    block = PAGE.read_text().split("## The package map", 1)[1].split("```", 2)[1]
    entries: list[tuple[str, str]] = []
    for line in block.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            head = line.split()[0].rstrip(",")
            entries.append((head, line[len(line.split()[0]):]))
        elif entries:
            entries[-1] = (entries[-1][0], entries[-1][1] + " " + line)
    return entries


def covers(head: str, module: str) -> bool:
    pattern = head.replace("<system>", "*")
    if pattern.endswith("/"):
        return fnmatch.fnmatch(module, pattern + "*") and (
            "<system>" not in head or module.count("/") == pattern.count("/"))
    return fnmatch.fnmatch(module, pattern) and module.count("/") == pattern.count("/")


def named(module: str, entries: list[tuple[str, str]]) -> bool:
    stem = Path(module).stem
    word = re.compile(r"(?<![\w-])" + re.escape(stem) + r"(?![\w-])")
    return any(head == module or (covers(head, module) and word.search(text))
               for head, text in entries)


def modules() -> list[str]:
    found = []
    for base in ("kit", "bot", "adapters"):
        for path in sorted((ROOT / base).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if path.name != "__init__.py" and "/migrations/" not in rel:
                found.append(rel)
    return found


def test_every_module_is_named_on_the_architecture_page() -> None:
    entries = package_map()
    missing = [module for module in modules() if not named(module, entries)]
    assert not missing, ("not named in docs/architecture.md's package map (add each to the "
                         "entry of its folder): " + ", ".join(missing))


def test_the_check_sees_a_module_that_is_not_named() -> None:
    entries = package_map()
    assert len(modules()) > 200 and len(entries) > 15
    assert named("bot/service.py", entries) and named("kit/hostlist.py", entries)
    assert named("adapters/etcd/fake.py", entries)  # through adapters/<system>/
    assert not named("bot/store/no_such_room.py", entries)
    assert not named("adapters/etcd/deep/fake.py", entries)  # <system> is one folder
    assert not named("adapters/no_such.py", entries)
