"""``runbook --help`` cold start, against the interpreter's own start as a baseline.

Runs, interleaved, --runs times each (default 20) after one warm-up each:

* ``python -c pass``                     (baseline: the interpreter alone)
* ``python -m bot --help``
* ``runbook --help``                     (the installed console script beside python)

and prints median and p90 wall time in ms, plus each figure minus the baseline.
Then lists which heavy modules (sqlalchemy, pydantic, jinja2, yaml) ``--help``
imports, by running ``bot.surfaces.cli._parser().parse_args(["--help"])`` in a child and
reading ``sys.modules`` at exit, and shows the largest cumulative imports from
``python -X importtime``. Goal: < 300 ms, and no heavy module imported.

Then, against the lab (RUNBOOK_CONFIG from ``eval "$(deploy/lab/lab env)"``; skipped, saying
so, without it): ``runbook node NAME`` cold, interleaved with the floor measured in the same
run (``scontrol show node NAME`` and one Prometheus query, the systems' own answer time), and
which of sqlalchemy, alembic, jinja2, kubernetes, requests it imports, and the same command
reading Kubernetes and Prometheus with the official client and requests (as before
adapters.kubernetes.quickread and adapters.prometheus.quick), with the CPU time (user+sys)
of each. Goal: median <= 300 ms.

Then every command that only reads (list, describe, status, history, proposals, node,
versions) and ``runbook plan`` and ``run`` on a shipped runbook (selftest), each as a new
process, interleaved with ``python -c pass`` in the same run, on a state of their own (a
temporary SQLite database made by ``runbook db init``, ``database: {create: true}``, four
inventory nodes, the shipped runbooks), with the check cache warm (as after any earlier
command) and, for ``list``, without it (the first start after a runbook changed), beside the
floor every command pays (the configuration read and SQLAlchemy imported). Goals: the
reading commands <= 300 ms, plan and run <= 500 ms (median).

Run: .venv/bin/python bench/cold_start.py [--runs 20] [--node NAME] [--commands-only]

Prints human-readable lines and, last, one JSON line. It never asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchkit import finish

GOAL_MS = 300.0
HEAVY = ("sqlalchemy", "pydantic", "jinja2", "yaml", "alembic")
NOT_FOR_NODE = ("sqlalchemy", "alembic", "jinja2", "kubernetes", "requests",
                "prometheus_api_client")  # `runbook node` needs none of them
ROOT = Path(__file__).resolve().parent.parent

PROBE = r"""
import atexit, json, sys
def _report():
    names = sorted({m.split(".")[0] for m in sys.modules})
    sys.__stderr__.write("\nMODULES " + json.dumps(names) + "\n")
atexit.register(_report)
import bot.surfaces.cli
bot.surfaces.cli._parser().parse_args(["--help"])
"""


def timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, env=env, cwd=ROOT, check=False)
    elapsed = (time.perf_counter() - t0) * 1000
    if done.returncode != 0:
        raise SystemExit(f"{argv} exited {done.returncode}")
    return elapsed


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--node", help="the node for `runbook node` (default: the first of "
                                       "the configuration's inventory.nodes)")
    parser.add_argument("--commands-only", action="store_true",
                        help="only the commands on a state of their own (not --help, node)")
    args = parser.parse_args(argv)
    if args.commands_only:
        finish("cold_start", {"benchmark": "cold_start", "runs": args.runs,
                              "commands": commands_cold_start(args.runs)})
        return 0

    python = sys.executable
    script = Path(python).parent / ("runbook.exe" if os.name == "nt" else "runbook")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    commands: dict[str, list[str]] = {
        "python -c pass": [python, "-c", "pass"],
        "python -m bot --help": [python, "-m", "bot", "--help"],
    }
    if script.exists():
        commands["runbook --help"] = [str(script), "--help"]
    else:
        print(f"note: no installed console script beside {Path(python).name}; skipped")

    samples: dict[str, list[float]] = {name: [] for name in commands}
    for argv_ in commands.values():  # warm-up: file cache, .pyc files
        timed(argv_, env)
    for _ in range(args.runs):
        for name, argv_ in commands.items():
            samples[name].append(timed(argv_, env))

    base = statistics.median(samples["python -c pass"])
    figures: dict[str, Any] = {}
    print(f"cold start, {args.runs} runs each (interleaved, after one warm-up), wall ms:")
    for name, values in samples.items():
        median, p90 = statistics.median(values), pct(values, 90)
        figures[name] = {"median_ms": median, "p90_ms": p90, "min_ms": min(values),
                         "minus_interpreter_ms": median - base}
        extra = "" if name == "python -c pass" else f"  (minus interpreter: {median - base:.1f})"
        print(f"  {name:<26} median {median:7.1f}  p90 {p90:7.1f}  min {min(values):7.1f}"
              f"{extra}")

    # which top-level packages does --help import?
    probe = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, env=env,
                           cwd=ROOT, check=False)
    line = next((ln for ln in probe.stderr.splitlines() if ln.startswith("MODULES ")), None)
    loaded = json.loads(line[len("MODULES "):]) if line else []
    heavy = [m for m in HEAVY if m in loaded]
    project = [m for m in loaded if m in ("bot", "adapters")]
    print(f"modules imported by --help: {len(loaded)} top-level packages; "
          f"heavy ones: {', '.join(heavy) if heavy else 'none'}")

    # where does the import time go? (python -X importtime, cumulative microseconds)
    it = subprocess.run([python, "-X", "importtime", "-m", "bot", "--help"],
                        capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    rows = []
    for ln in it.stderr.splitlines():
        if not ln.startswith("import time:") or "cumulative" in ln:
            continue
        parts = ln[len("import time:"):].split("|")
        if len(parts) != 3:
            continue
        try:
            rows.append((int(parts[1]), int(parts[0]), parts[2][1:].rstrip()))
        except ValueError:
            continue
    top_level = sorted((r for r in rows if not r[2].startswith("  ")), reverse=True)[:8]
    print("largest top-level imports (python -X importtime, cumulative ms):")
    for cum, _self, name in top_level:
        print(f"  {cum / 1000:7.2f}  {name.strip()}")

    goal_met = all(f["median_ms"] < GOAL_MS for n, f in figures.items() if n != "python -c pass")
    print(f"goal: --help < {GOAL_MS:g} ms: {'met' if goal_met else 'MISSED'}; "
          f"no heavy module imported: {'met' if not heavy else 'MISSED'}")
    node = node_cold_start(script if script.exists() else None, env, args.runs, args.node)
    result = {
        "commands": commands_cold_start(args.runs),
        "node_command": node,
        "benchmark": "cold_start",
        "runs": args.runs,
        "python": sys.version.split()[0],
        "figures": figures,
        "heavy_modules_imported": heavy,
        "project_packages_imported": project,
        "top_imports_ms": [[name.strip(), cum / 1000] for cum, _s, name in top_level],
        "goal_ms": GOAL_MS,
        "goal_met": goal_met,
        "no_heavy_imports": not heavy,
    }
    finish("cold_start", result)
    return 0


READING_GOAL_MS, PLANNING_GOAL_MS = 300.0, 500.0
# what every command needs before it does anything: the configuration read (pydantic, every
# adapter's section) and the database library, pydantic's plugins left alone as runbook does
FLOOR = "floor: config + sqlalchemy"
FLOOR_CODE = ("import os; os.environ.setdefault('PYDANTIC_DISABLE_PLUGINS', '__all__'); "
              "import bot.config, bot.store.db; bot.config.load_config(None)")
COMMANDS: dict[str, list[str]] = {  # the name shown -> the arguments of `runbook`
    "list": ["list"], "describe": ["describe", "drain-node"], "status": ["status", "1"],
    "history": ["history"], "proposals": ["proposals"], "node": ["node", "gpu01"],
    "versions": ["versions", "selftest"],
    "plan": ["plan", "selftest"], "run": ["run", "selftest"],
}


def commands_cold_start(runs: int) -> dict[str, Any]:
    """Each command as a new process on a state of its own, beside ``python -c pass``."""
    import tempfile

    script = Path(sys.executable).with_name("runbook")
    with tempfile.TemporaryDirectory(prefix="cold-start-") as tmp:
        env = _command_state(Path(tmp))
        timed([str(script), "db", "init"], env)
        timed([str(script), "run", "selftest"], env)  # execution 1, for `status 1`
        cache = Path(tmp) / "runbook-checks.json"
        argvs = {name: [str(script), *words] for name, words in COMMANDS.items()}
        argvs["list, no check cache"] = argvs["list"]
        argvs[FLOOR] = [sys.executable, "-c", FLOOR_CODE]
        samples: dict[str, list[float]] = {"python -c pass": [], **{n: [] for n in argvs}}
        for argv_ in argvs.values():  # warm-up: file cache, .pyc files, the check cache
            timed(argv_, env)
        for _ in range(runs):
            samples["python -c pass"].append(timed([sys.executable, "-c", "pass"], env))
            for name, argv_ in argvs.items():
                if name == "list, no check cache":
                    cache.unlink(missing_ok=True)
                samples[name].append(timed(argv_, env))
    return _command_figures(samples, runs)


def _command_state(folder: Path) -> dict[str, str]:
    """A configuration of its own: SQLite in ``folder``, made by db init, four nodes."""
    config = folder / "config.yaml"
    config.write_text(json.dumps({  # JSON is YAML
        "database_url": f"sqlite:///{folder / 'bot.db'}", "database": {"create": True},
        "inventory": {"nodes": ["gpu01", "gpu02", "gpu03", "gpu04"]}}))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "RUNBOOK_", "SLURM_", "KUBECONFIG"))}
    return dict(env, RUNBOOK_CONFIG=str(config), XDG_STATE_HOME=str(folder / "state"))


def _command_figures(samples: dict[str, list[float]], runs: int) -> dict[str, Any]:
    base = statistics.median(samples["python -c pass"])
    floor = statistics.median(samples[FLOOR])
    figures: dict[str, Any] = {"runs": runs, "interpreter_ms": base, "each": {}}
    print(f"commands cold, {runs} runs each (interleaved, after one warm-up), wall ms; "
          f"python -c pass median {base:.1f}:")
    for name, values in samples.items():
        if name == "python -c pass":
            continue
        median = statistics.median(values)
        if name == FLOOR:
            figures["floor_ms"] = median
            print(f"  {FLOOR:<30} median {median:7.1f}  ({median / base:4.1f}x python -c pass)")
            continue
        goal = PLANNING_GOAL_MS if name in ("plan", "run") else READING_GOAL_MS
        over = median - floor  # what the command costs beyond the imports every one pays
        figures["each"][name] = {"median_ms": median, "p90_ms": pct(values, 90),
                                 "min_ms": min(values), "times_interpreter": median / base,
                                 "over_floor_ms": over, "goal_ms": goal,
                                 "goal_met": median <= goal}
        print(f"  runbook {name:<22} median {median:7.1f}  p90 {pct(values, 90):7.1f}  "
              f"min {min(values):7.1f}  ({median / base:4.1f}x python -c pass, floor "
              f"{over:+6.1f}; goal {goal:g}: {'met' if median <= goal else 'MISSED'})")
    return figures


NODE_PROBE = r"""
import atexit, json, sys
atexit.register(lambda: sys.__stderr__.write(
    "\nMODULES " + json.dumps(sorted({m.split(".")[0] for m in sys.modules})) + "\n"))
from bot.surfaces.cli import main
sys.exit(main(["node", sys.argv[1]]))
"""

# `runbook node NAME` as before adapters.kubernetes.quickread and adapters.prometheus.quick:
# the official Kubernetes client and requests (prometheus-api-client) read
OFFICIAL_CLIENT = r"""
import sys
from bot.surfaces import nodeparts
nodeparts.VIEW_BACKENDS["kubernetes"] = ("adapters.kubernetes.client", "make_backend")
nodeparts.VIEW_BACKENDS["prometheus"] = ("adapters.prometheus.backend", "PrometheusApiBackend")
from bot.surfaces.cli import main
sys.exit(main(["node", sys.argv[1]]))
"""


def node_cold_start(script: Path | None, env: dict[str, str], runs: int,
                    node: str | None) -> dict[str, Any] | None:
    """``runbook node NAME`` from a cold start against the lab, beside its floor."""
    config = os.environ.get("RUNBOOK_CONFIG")
    if not config or not os.environ.get("RUNBOOK_LAB_DIR") or script is None:
        print("runbook node NAME: skipped: needs the lab (deploy/lab/lab up && "
              'eval "$(deploy/lab/lab env)": RUNBOOK_CONFIG and RUNBOOK_LAB_DIR) and the '
              "installed runbook script")
        return None
    name = node or _first_node(Path(config))
    prometheus = os.environ.get("PROMETHEUS_URL")
    command, base, floor, cpu, official, official_cpu = [], [], [], [], [], []
    official_argv = [sys.executable, "-c", OFFICIAL_CLIENT, name]
    timed([str(script), "node", name], env)  # warm-up
    timed(official_argv, env)
    for _ in range(runs):
        base.append(timed([sys.executable, "-c", "pass"], env))
        before = _children_cpu()
        command.append(timed([str(script), "node", name], env))
        cpu.append(_children_cpu() - before)  # steadier than wall time on a busy machine
        before = _children_cpu()
        official.append(timed(official_argv, env))
        official_cpu.append(_children_cpu() - before)
        floor.append(_floor(name, prometheus, env))
    probe = subprocess.run([sys.executable, "-c", NODE_PROBE, name], capture_output=True,
                           text=True, env=env, cwd=ROOT, check=False)
    line = next((ln for ln in probe.stderr.splitlines() if ln.startswith("MODULES ")), "")
    loaded = json.loads(line[len("MODULES "):]) if line else []
    heavy = [m for m in NOT_FOR_NODE if m in loaded]
    median, interpreter = statistics.median(command), statistics.median(base)
    figures = {"node": name, "median_ms": median, "p90_ms": pct(command, 90),
               "min_ms": min(command), "interpreter_ms": interpreter,
               "cpu_median_ms": statistics.median(cpu),
               "floor_median_ms": statistics.median(floor), "heavy_imported": heavy,
               "official_client_median_ms": statistics.median(official),
               "official_client_cpu_median_ms": statistics.median(official_cpu),
               "goal_ms": GOAL_MS, "goal_met": median <= GOAL_MS}
    print(f"`runbook node {name}` cold, {runs} runs: median {median:.1f}  p90 "
          f"{figures['p90_ms']:.1f}  min {min(command):.1f} ms (interpreter alone "
          f"{interpreter:.1f}; CPU {figures['cpu_median_ms']:.1f}); floor (scontrol show "
          "node + one Prometheus query"
          f"{'' if prometheus else ': no PROMETHEUS_URL, scontrol only'}) "
          f"{figures['floor_median_ms']:.1f} ms")
    print(f"  before (the official Kubernetes client and requests): median "
          f"{figures['official_client_median_ms']:.1f} ms, CPU "
          f"{figures['official_client_cpu_median_ms']:.1f}")
    print(f"goal: runbook node <= {GOAL_MS:g} ms: {'met' if figures['goal_met'] else 'MISSED'}"
          f"; imports {', '.join(heavy) if heavy else 'none'} of {', '.join(NOT_FOR_NODE)}")
    return figures


def _children_cpu() -> float:
    import resource

    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (used.ru_utime + used.ru_stime) * 1000


def _first_node(config: Path) -> str:
    import yaml  # the benchmark's own process: its start is not measured

    nodes = ((yaml.safe_load(config.read_text()) or {}).get("inventory") or {}).get("nodes")
    if not nodes:
        raise SystemExit(f"{config} lists no inventory.nodes: name one with --node")
    return str(nodes[0])


def _floor(name: str, prometheus: str | None, env: dict[str, str]) -> float:
    """What the systems take to answer: Slurm's own client, and one query over HTTP."""
    import urllib.parse
    import urllib.request

    t0 = time.perf_counter()
    subprocess.run(["scontrol", "show", "node", name], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, env=env, check=False)
    if prometheus:
        query = urllib.parse.urlencode({"query": f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{name}"}}'})
        with urllib.request.urlopen(f"{prometheus}/api/v1/query?{query}", timeout=10) as got:
            got.read()
    return (time.perf_counter() - t0) * 1000


if __name__ == "__main__":
    sys.exit(main())
