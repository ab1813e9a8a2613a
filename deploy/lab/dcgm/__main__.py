"""`python3 -m dcgm --port N [--faults DIR] [--nodes a,b] [--driver V] [--log FILE]`."""
from __future__ import annotations

import sys

from .server import main

if __name__ == "__main__":
    sys.exit(main())
