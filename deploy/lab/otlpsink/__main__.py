"""python -m otlpsink --port P --out FILE [--log FILE]: see otlpsink/server.py."""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from .server import serve


def main() -> int:
    parser = argparse.ArgumentParser(prog="otlpsink", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--out", type=Path, required=True, help="received records, JSON lines")
    parser.add_argument("--log", type=Path, help="one line per request")
    args = parser.parse_args()
    server = serve(args.host, args.port, args.out, args.log)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
