"""Leader failover time: two `runbook serve` replicas on one PostgreSQL database against the
lab; the leader is killed with SIGKILL in the middle of a drain-node (its wait-idle step
waits for a Slurm job), and the other replica takes over.

Measured from the SIGKILL (wall clock, one machine), median over ``--runs``:

* leadership moved: until the survivor's /healthz says it leads (PostgreSQL frees the
  advisory lock when the killed process's socket closes; the survivor tries every
  ``leader_election.retry_seconds``);
* execution resumed (the failover time): until the survivor's engine wrote the "resumed"
  audit event for the execution (the dead engine's lease, ``engine.lease_seconds``, had to
  run out first), and until the interrupted step started again; also the part of it after
  that lease ran out (the new leader's engine loop finding the execution);
* finished: until the execution succeeded (the job is released at the takeover, so this
  is the takeover plus the rest of the run: wait-idle's next poll and the post-check).

The kills are spread over one heartbeat period (a third of the lease): a dead engine's
lease has between 2/3 and all of ``engine.lease_seconds`` left, depending on when it last
renewed. After each run the killed replica is started again (it becomes the follower) and the node
is resumed, so the next run kills the other replica.

Needs a running lab (`deploy/lab/lab up && eval "$(deploy/lab/lab env)"`) and PostgreSQL
server binaries (as the tests: `RUNBOOK_TEST_PG_URL`, else a throw-away server from
Debian's packages).

It starts from a clean lab (`lab reset`, else its own leftovers: jobs named
grb-bench-failover-hold, gpu03 drained) and leaves it so, also on failure, Ctrl-C or SIGTERM:
the holding jobs are cancelled by name, the node resumed, the replicas and PostgreSQL stopped.

Run: .venv/bin/python bench/failover.py [--runs 5] [--lease-seconds 3] [--retry-seconds 0.5]

Prints readable lines and, last, one JSON line. It never asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchkit import cleanup_on_signals, finish  # noqa: E402  (bench/, next to this file)
from labclean import clean, reset_lab  # noqa: E402

from tests import postgres  # noqa: E402
from tests.lab.fixture import client_env  # noqa: E402
from tests.runbooks.test_failover import (  # noqa: E402
    NODE,
    Failover,
    HaCluster,
    failover_once,
    hold_node,
    put_node_back,
)

JOB = "grb-bench-failover-hold"  # found by name when a run failed or was stopped


def summary(values: list[float]) -> dict[str, float]:
    return {"median_s": round(statistics.median(values), 2), "min_s": round(min(values), 2),
            "max_s": round(max(values), 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--lease-seconds", type=float, default=3.0,
                        help="engine.lease_seconds of the replicas (default 3; the lab's "
                             "bot.yaml says 10, the built-in default is 30)")
    parser.add_argument("--retry-seconds", type=float, default=0.5,
                        help="leader_election.retry_seconds (built-in default 2)")
    args = parser.parse_args(argv)
    lab_dir = os.environ.get("RUNBOOK_LAB_DIR")
    if not lab_dir or not (Path(lab_dir) / "lab.json").exists():
        sys.exit('needs the lab: deploy/lab/lab up && eval "$(deploy/lab/lab env)"')
    info = json.loads((Path(lab_dir) / "lab.json").read_text())
    env = client_env(info)
    cleanup_on_signals()
    try:
        server = postgres.start()
    except postgres.PostgresMissing as exc:
        sys.exit(f"{exc} (or `make deps`; or set RUNBOOK_TEST_PG_URL)")
    runs: list[Failover] = []
    try:
        if not reset_lab(env):
            clean(env, JOB, [NODE])
        url = postgres.fresh_database(server.url, f"bench_{secrets.token_hex(6)}")
        with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp:
            cluster = HaCluster(env, Path(lab_dir), url, Path(tmp),
                                lease_seconds=args.lease_seconds,
                                retry_seconds=args.retry_seconds)
            try:
                cluster.start()
                for number in range(1, args.runs + 1):
                    release = Path(tmp) / f"release-{number}"
                    job = hold_node(env, NODE, release, JOB)
                    # Kills spread over one heartbeat period (lease/3), so the dead
                    # engine's lease has anything from 2/3 to all of its length left.
                    delay = 0.3 + (number - 1) * args.lease_seconds / 3 / args.runs
                    try:
                        result = failover_once(cluster, release, delay=delay)
                    finally:
                        put_node_back(env, NODE, job)
                    state = cluster.state(result.execution_id)
                    runs.append(result)
                    print(f"run {number}: killed {result.killed.name} (pid "
                          f"{result.killed.pid}) {delay:.2f}s into wait-idle; leadership moved "
                          f"{result.leadership_moved:.2f}s, resumed {result.resumed:.2f}s "
                          f"(lease had {result.lease_left:.2f}s left), step restarted "
                          f"{result.step_restarted:.2f}s, {state} {result.finished:.2f}s after "
                          "the kill", flush=True)
                    cluster.launch(result.killed)  # back as the follower
                    cluster.wait_up(result.killed)
                verify = cluster.cli("audit", "verify")
                print(f"audit verify: exit {verify.returncode}")
            finally:
                cluster.stop()
    finally:
        server.stop()
        clean(env, JOB, [NODE])  # a job left by a failed run would hold gpu03 for good
    figures = {
        "runs": len(runs),
        "engine_lease_seconds": args.lease_seconds,
        "retry_seconds": args.retry_seconds,
        "leadership_moved": summary([r.leadership_moved for r in runs]),
        "execution_resumed": summary([r.resumed for r in runs]),
        "step_restarted": summary([r.step_restarted for r in runs]),
        "resumed_after_lease_ran_out": summary([r.after_lease for r in runs]),
        "finished": summary([r.finished for r in runs]),
        "audit_verify_ok": verify.returncode == 0,
    }
    # Goal: resumed within the lease plus one second (the engine loop's poll and a claim).
    figures["goal_met"] = figures["execution_resumed"]["max_s"] <= args.lease_seconds + 1
    print(f"leader failover, median of {len(runs)} (engine.lease_seconds "
          f"{args.lease_seconds:g}, leader_election.retry_seconds {args.retry_seconds:g}): "
          f"leadership moved {figures['leadership_moved']['median_s']}s, execution resumed "
          f"{figures['execution_resumed']['median_s']}s after the SIGKILL, "
          f"{figures['resumed_after_lease_ran_out']['median_s']}s after the dead engine's lease "
          f"ran out; goal (every run resumed within lease + 1 s): "
          f"{'met' if figures['goal_met'] else 'NOT met'}")
    finish("failover", figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
