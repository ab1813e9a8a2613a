"""``NAME=-`` on the command line: a secret parameter's value read from the terminal (not
echoed) or, when stdin is not one, from its first line, so it stays out of the shell's history
and the process list."""

from __future__ import annotations

import getpass
import sys
from collections.abc import Mapping
from typing import TextIO

from bot.service import Service
from kit.errors import Refused

ASK = "-"


def filled(service: Service, runbook: str, raw: Mapping[str, str],
           stdin: TextIO | None = None) -> dict[str, str]:
    """``raw`` with each secret parameter given as ``-`` read in; others untouched."""
    asked = [name for name, value in raw.items() if value == ASK]
    if not asked:
        return dict(raw)
    known = service.known(runbook)
    secret = {n for n, spec in (known.params.items() if known else ()) if spec.secret}
    values = dict(raw)
    stream = stdin or sys.stdin
    for name in asked:
        if name not in secret:
            continue  # "-" is that parameter's value; validation judges it
        if stream.isatty():
            values[name] = getpass.getpass(f"{name} (secret, not shown): ")
        else:
            line = stream.readline()
            if not line:
                raise Refused(f"{name}=-: nothing to read on stdin")
            values[name] = line.rstrip("\r\n")
    return values
