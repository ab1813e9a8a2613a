"""``runbook chat``: the chat grammar at a terminal, or read from standard input as a script.

The answers are exactly those a chat surface shows. The same process runs the
engine, so a requested or approved run starts while you type; its progress lines
appear as ``[ID] ...``. With ``lab: true``, ``/as alice`` switches identity so a
request and its approval by another person can be shown. ``/quit`` (or end of
input) leaves, after the runs already started have ended.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TextIO

from bot.execution.engine import Engine
from bot.service import Service
from bot.surfaces.chat import commands

PROMPT = "runbook> "


def _interactive() -> Iterator[str]:
    while True:
        try:
            yield input(PROMPT)
        except EOFError:
            return


def run_chat(service: Service, user: str, *, lines: Iterable[str] | None = None,
             out: TextIO = sys.stdout) -> int:
    lock = threading.Lock()

    def say(text: str) -> None:
        with lock:
            print(text, file=out, flush=True)

    engine = Engine(service, report=lambda execution_id, line: say(f"[{execution_id}] {line}"))
    stop = threading.Event()
    worker = threading.Thread(target=engine.run_pending, kwargs={"stop": stop},
                              name="engine", daemon=True)
    worker.start()
    failures = 0
    try:
        for raw in lines if lines is not None else _interactive():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if line in ("/quit", "/exit"):
                break
            if line.startswith("/as"):
                user = _switch(service, line, user, say)
                continue
            if lines is not None:
                say(f"{user}> {line}")
            reply = commands.handle(service, line, user)
            failures += 0 if reply.ok else 1
            say(reply.text)
    finally:
        stop.set()
        worker.join()
        engine.run_pending(once=True)  # runs started here end before the chat does
        engine.close()
    return 0 if failures == 0 else 1


def _switch(service: Service, line: str, user: str, say: Callable[[str], None]) -> str:
    words = line.split()
    if not service.config.lab:
        say("/as is only available when the configuration says lab: true")
        return user
    if len(words) != 2:
        say("usage: /as NAME")
        return user
    say(f"you are now {words[1]}")
    return words[1]
