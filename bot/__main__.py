"""``python -m bot``: the ``runbook`` command."""

import sys

from bot.surfaces.cli import main

if __name__ == "__main__":
    sys.exit(main())
