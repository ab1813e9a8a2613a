"""The layer contracts (pyproject.toml, import-linter) cover every module of bot/: each module
is a layer of a layered contract or inside one, and a contract that layers the children of a
package (bot's, bot.surfaces') names every child, so a new module cannot sit outside them
unnoticed. A module missing fails here, naming it and the contract to add it to."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def bot_modules() -> set[str]:
    """Every module and package under bot/, by its dotted name (bot itself left out)."""
    found = set()
    for path in (ROOT / "bot").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        if all(part.isidentifier() for part in parts) and len(parts) > 1:
            found.add(".".join(parts))
    return found


def layered_contracts() -> dict[str, list[str]]:
    """Contract name -> its layer entries ("a | b" and "a : b" are two; "(a)" is a)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    found = {}
    for contract in contracts:
        if contract["type"] != "layers":
            continue
        entries = []
        for layer in contract["layers"]:
            for entry in layer.replace(":", "|").split("|"):
                entries.append(entry.strip().removeprefix("(").removesuffix(")").strip())
        found[contract["name"]] = entries
    return found


def inside(module: str, entry: str) -> bool:
    return module == entry or module.startswith(entry + ".")


def test_every_module_of_bot_is_in_a_layer() -> None:
    entries = [entry for layers in layered_contracts().values() for entry in layers]
    missing = sorted(m for m in bot_modules() if not any(inside(m, e) for e in entries))
    assert not missing, f"modules in no layer of pyproject.toml's layered contracts: {missing}"


def test_a_contract_over_a_package_names_every_child_of_it() -> None:
    modules = bot_modules()
    problems = []
    for name, entries in layered_contracts().items():
        parents = {entry.rpartition(".")[0] for entry in entries}
        if len(parents) != 1 or not parents <= {"bot", *modules}:
            continue  # not the children of one package of bot
        (parent,) = parents
        children = {m for m in modules if m.rpartition(".")[0] == parent}
        problems += [f"{child}: not a layer of {name!r}"
                     for child in sorted(children - set(entries))]
    assert not problems, "\n".join(problems)


def test_the_contracts_named_are_there() -> None:
    """The two contracts this test reads exist, so it cannot pass by reading nothing."""
    contracts = layered_contracts()
    assert "bot.surfaces.cli" in contracts[
        "the surfaces do not know each other, except through the chat grammar"]
    assert "bot.service" in contracts["bot in layers: each package imports only the ones below it"]
    assert all(inside(m, "bot") for m in bot_modules()) and "bot.surfaces.console" in bot_modules()
