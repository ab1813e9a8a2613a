"""`python3 -m kubeapi --port N [--state FILE] [--faults DIR] [--log FILE] [--audit-log FILE]
[--nodes a,b] [--handoff c]`."""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from pathlib import Path
from types import FrameType

from .audit import RequestLog
from .cluster import Cluster, Timing
from .controllers import ControllerLoop
from .faults import FaultSwitch
from .seed import HANDOFF_NODES, seed
from .server import ApiServer
from .store import Store


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kubeapi", description="The lab's Kubernetes API server.")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--state", type=Path, help="JSON state file: loaded when present, "
                   "else the pool is seeded; written while running")
    p.add_argument("--faults", type=Path, help="lab faults folder ($LAB/faults)")
    p.add_argument("--log", type=Path, help="request log file (default: stderr)")
    p.add_argument("--audit-log", type=Path, help="append one JSON line per request with its "
                   "RBAC attributes (verb, apiGroup, resource, ..., user agent) to this file")
    p.add_argument("--nodes", default="gpu05,gpu06,gpu07,gpu08", help="seeded GPU nodes")
    p.add_argument("--handoff", default=",".join(HANDOFF_NODES),
                   help="seeded Slurm nodes registered here too, serving Slurm")
    p.add_argument("--driver", default="535.161.08", help="seeded driver version")
    p.add_argument("--pod-ready", type=float, default=Timing.pod_ready,
                   help="seconds until a new pod is Ready")
    p.add_argument("--pod-grace", type=float, default=Timing.pod_grace,
                   help="cap on pod termination grace, seconds")
    p.add_argument("--tick", type=float, default=Timing.tick,
                   help="controller loop period, seconds (longer: less CPU for big pools)")
    p.add_argument("--upgrade-step", type=float, default=Timing.upgrade_step,
                   help="seconds per driver upgrade state")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    handler: logging.Handler = (logging.FileHandler(args.log) if args.log
                                else logging.StreamHandler())
    logging.basicConfig(level=logging.INFO, handlers=[handler],
                        format="%(asctime)s %(levelname)s %(message)s")
    timing = Timing(pod_ready=args.pod_ready, pod_grace=args.pod_grace,
                    upgrade_step=args.upgrade_step, tick=args.tick)
    cluster = Cluster(Store(args.state), timing, args.faults)
    if args.state and args.state.exists():
        cluster.store.load(json.loads(args.state.read_text()))
    else:
        seed(cluster, [n for n in args.nodes.split(",") if n], args.driver,
             [n for n in args.handoff.split(",") if n])
    request_log = RequestLog(args.audit_log) if args.audit_log else None
    server = ApiServer((args.host, args.port), cluster, FaultSwitch(args.faults), request_log)
    loop = ControllerLoop(cluster)
    loop.start()

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    logging.info("kubeapi listening on http://%s:%d", args.host, args.port)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        loop.stopping.set()
        server.server_close()
        if request_log is not None:
            request_log.close()
        cluster.store.dirty = True
        cluster.store.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
