"""Mutation testing of the safety core (`make mutate`): mutmut, each module against its own
fast tests (deploy/mutate/modules.toml), in a temporary copy of the tree that is removed at
the end, so a stopped run leaves nothing behind. Prints per module killed, survived, timed
out and equivalent (deploy/mutate/equivalent.toml, each with its reason), then one JSON line:
{"killed": K, "total": N, "score": killed / (total - equivalent), "survivors": [...]}.

Run: .venv/bin/python bench/mutate.py [--only MODULE ...] [--jobs N] [--source DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchkit import cleanup_on_signals  # bench/, next to this file

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "deploy" / "mutate" / "modules.toml"
EQUIVALENT = ROOT / "deploy" / "mutate" / "equivalent.toml"
# what the copy leaves out: the venv, git, caches and a previous run's mutants
SKIP = shutil.ignore_patterns(".venv", ".git", "__pycache__", "*.egg-info", ".mypy_cache",
                              ".ruff_cache", ".pytest_cache", ".hypothesis", "mutants", "*.db")
FAST = "not lab and not ownlab and not postgres and not image"
KILLED = {1, 3}  # pytest failed, or errored inside pytest
TIMED_OUT = {24, -24, 152, 255, 36, -9}  # SIGXCPU from mutmut's limits, or SIGKILL after it
NO_TESTS = "could not find any test case for any mutant"  # mutmut's words, then exit 1
SEP = "ǁ"  # mutmut's separator between class and method in a mutant's name


@dataclass
class Mutant:
    module: str
    function: str
    change: str
    status: str  # killed, survived, timed out, equivalent

    @property
    def key(self) -> str:
        return f"{self.module} | {self.function} | {self.change}"


@dataclass
class Tally:
    module: str
    mutants: list[Mutant] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(1 for m in self.mutants if m.status == status)


def load_modules(only: list[str]) -> dict[str, dict[str, Any]]:
    modules: dict[str, dict[str, Any]] = tomllib.loads(CONFIG.read_text())["modules"]
    unknown = sorted(set(only) - set(modules))
    if unknown:
        sys.exit(f"not in {CONFIG.name}: {', '.join(unknown)}")
    return {name: spec for name, spec in modules.items() if not only or name in only}


def load_equivalent() -> dict[str, str]:
    """Stable key (module | function | change) -> why no test can tell it apart."""
    entries = tomllib.loads(EQUIVALENT.read_text()).get("equivalent", [])
    return {entry["mutant"]: entry["reason"] for entry in entries}


def copy_tree(source: Path, into: Path) -> None:
    for entry in source.iterdir():
        if SKIP(str(source), [entry.name]):
            continue
        if entry.is_dir():
            shutil.copytree(entry, into / entry.name, ignore=SKIP, symlinks=True)
        else:
            shutil.copy2(entry, into / entry.name)


def write_mutmut_config(tree: Path, module: str, tests: list[str]) -> None:
    """mutmut reads setup.cfg when pyproject.toml has no [tool.mutmut]; the whole packages
    are copied into its mutants/ folder (for imports), only ``module`` is mutated."""
    def lines(values: list[str]) -> str:
        return "".join(f"\n    {value}" for value in values)

    (tree / "setup.cfg").write_text(
        "[mutmut]\n"
        f"source_paths ={lines(['kit', 'bot', 'adapters'])}\n"
        f"only_mutate ={lines([module])}\n"
        f"also_copy ={lines(['deploy', 'runbooks', 'docs', 'setup.py'])}\n"
        f"pytest_add_cli_args_test_selection ={lines(tests)}\n"
        f"pytest_add_cli_args ={lines(['-p', 'no:cacheprovider', '-m', FAST])}\n"
        "timeout_multiplier = 5.0\n"
        "use_git_change_detection = false\n")


def patterns(module: str, functions: list[str]) -> list[str]:
    """mutmut's names for the mutants of ``functions`` (``Class.method`` or ``function``)."""
    dotted = module.removesuffix(".py").replace("/", ".")
    names = []
    for function in functions:
        owner, _, name = function.rpartition(".")
        mangled = f"x{SEP}{owner}{SEP}{name}" if owner else f"x_{name}"
        names.append(f"{dotted}.{mangled}__mutmut_*")
    return names


@contextmanager
def inside(folder: Path) -> Iterator[None]:
    before = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def function_of(name: str) -> str:
    """``bot.x.engine.xǁEngineǁ_start__mutmut_3`` -> ``Engine._start``."""
    mangled = name.rpartition(".")[2].rpartition("__mutmut_")[0]
    if mangled.startswith(f"x{SEP}"):
        _, owner, method = mangled.split(SEP)
        return f"{owner}.{method}"
    return mangled.removeprefix("x_")


def change_of(name: str, module: str) -> str:
    """What the mutant changed, as ``old line -> new line`` (stripped): the same text from one
    run to the next, unlike mutmut's numbers."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    diff = get_diff_for_mutant(name, path=module).splitlines()[2:]
    old = " / ".join(line[1:].strip() for line in diff if line.startswith("-"))
    new = " / ".join(line[1:].strip() for line in diff if line.startswith("+"))
    return f"{old} -> {new}"


def status_of(exit_code: int | None) -> str:
    if exit_code in KILLED:
        return "killed"
    if exit_code in TIMED_OUT:
        return "timed out"
    return "survived"  # survived, no test reached it, or not run: all count against the score


def read_results(tree: Path, module: str, wanted: list[str],
                 equivalent: dict[str, str]) -> Tally:
    from fnmatch import fnmatch

    meta = json.loads((tree / "mutants" / f"{module}.meta").read_text())
    tally = Tally(module)
    seen: Counter[str] = Counter()
    with inside(tree):
        for name, code in sorted(meta["exit_code_by_key"].items(), key=lambda kv: _number(kv[0])):
            if wanted and not any(fnmatch(name, pattern) for pattern in wanted):
                continue
            mutant = Mutant(module, function_of(name), change_of(name, module), status_of(code))
            seen[mutant.key] += 1
            if seen[mutant.key] > 1:  # the same change twice in one function
                mutant.change += f" (#{seen[mutant.key]})"
            if mutant.status == "survived" and mutant.key in equivalent:
                mutant.status = "equivalent"
            tally.mutants.append(mutant)
    return tally


def _number(name: str) -> tuple[str, int]:
    head, _, number = name.rpartition("__mutmut_")
    return head, int(number) if number.isdigit() else 0


def run_module(tree: Path, module: str, spec: dict[str, Any], jobs: int,
               equivalent: dict[str, str]) -> Tally:
    shutil.rmtree(tree / "mutants", ignore_errors=True)
    write_mutmut_config(tree, module, spec["tests"])
    wanted = patterns(module, spec.get("functions", []))
    log = tree / f"mutmut-{module.replace('/', '-')}.log"
    with log.open("w") as out:
        # its own process group: a stopped run takes mutmut's forked workers with it
        mutmut = subprocess.Popen(
            [sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs), *wanted],
            cwd=tree, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        try:
            code = mutmut.wait()
        finally:
            with suppress(ProcessLookupError):
                os.killpg(mutmut.pid, signal.SIGKILL)
    if code != 0 and NO_TESTS not in log.read_text():  # no test reached any: all survive
        sys.stdout.write(log.read_text()[-4000:])
        raise SystemExit(f"mutmut failed on {module} (exit {code})")
    return read_results(tree, module, wanted, equivalent)


def report(tallies: list[Tally], equivalent: dict[str, str]) -> dict[str, Any]:
    print(f"{'module':44} {'killed':>6} {'survived':>8} {'timed out':>9} {'equivalent':>10}")
    for t in tallies:
        print(f"{t.module:44} {t.count('killed'):6} {t.count('survived'):8} "
              f"{t.count('timed out'):9} {t.count('equivalent'):10}")
    every = [m for t in tallies for m in t.mutants]
    killed = sum(1 for m in every if m.status == "killed")
    judged = sum(1 for m in every if m.status == "equivalent")
    survivors = [m for m in every if m.status in ("survived", "timed out")]
    for m in survivors:
        print(f"  {m.status}: {m.key}")
    stale = sorted(set(equivalent) - {m.key for m in every})
    for key in stale:  # listed as equivalent, but no such mutant (or it is killed now)
        print(f"  not a surviving mutant any more, remove from {EQUIVALENT.name}: {key}")
    total = len(every)
    score = round(killed / (total - judged), 4) if total > judged else 1.0
    return {"killed": killed, "total": total, "score": score,
            "survivors": [{"module": m.module, "function": m.function, "change": m.change,
                           "status": m.status} for m in survivors]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=[], help="modules (paths) to run")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--source", type=Path, default=ROOT, help="the tree to copy")
    args = parser.parse_args()
    cleanup_on_signals()
    modules = load_modules(args.only)
    equivalent = load_equivalent()
    started = time.monotonic()
    tree = Path(tempfile.mkdtemp(prefix="grb-mutate-"))
    try:
        copy_tree(args.source.resolve(), tree)
        tallies = []
        for module, spec in modules.items():
            began = time.monotonic()
            tallies.append(run_module(tree, module, spec, args.jobs, equivalent))
            print(f"{module}: {len(tallies[-1].mutants)} mutants, "
                  f"{time.monotonic() - began:.0f}s", flush=True)
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    figures = report(tallies, equivalent if not args.only else {
        k: v for k, v in equivalent.items() if k.split(" | ")[0] in modules})
    print(f"{time.monotonic() - started:.0f}s in all")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
