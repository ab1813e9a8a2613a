"""Slowloris: /healthz and a signed Slack slash command answer quickly while 200 slow clients
hold connections open by sending their request headers one byte a second.

The bot is a real `runbook serve` process with the Slack surface in HTTP mode against the
lab's fake of Slack's Web API, with its configuration's header deadline
(server.header_timeout_seconds, 10 s by default). The same requests are timed first with no
slow client (the baseline), then with `--slow` of them connected; each slow client sends
`POST /slack/events HTTP/1.1`, `Host: x` and then one header byte every `--byte-every`
seconds, and connects again when the server cuts it (the slow clients run in a process of
their own, as the bot runs in its own). Prints p50/p99/max of each, how many slow connections
the server cut and after how long, and the bot's thread count. Goal: p99 < 100 ms under
slowloris.

Needs a running lab: `deploy/lab/lab up && eval "$(deploy/lab/lab env)"`.
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing
import os
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml
from benchkit import finish  # bench/, next to this file

from bot.config import shipped_runbooks
from tests.bot.surfaces.slack.slackhelp import FakeSlack, SlackClientSide, free_port

GOAL_MS = 100.0
PREFIX = b"POST /slack/events HTTP/1.1\r\nHost: x\r\n"
DRIBBLE = b"X-Slowloris: " + b"a" * 4096  # sent a byte at a time, never ended


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(found: dict[str, list[float]]) -> dict[str, Any]:
    """p50/p99/max of each kind of request; the most threads ``runbook serve`` had."""
    return {**{kind: {"p50_ms": round(statistics.median(values), 2),
                      "p99_ms": round(percentile(values, 0.99), 2),
                      "max_ms": round(max(values), 2)}
               for kind, values in found.items() if kind != "threads"},
            "serve_threads_max": int(max(found["threads"]))}


@dataclass
class Conn:
    sock: socket.socket
    opened: float
    sent: int = 0


@dataclass
class SlowClients:
    """``count`` slowloris connections driven by one thread (selectors): one header byte each
    every ``every`` seconds; a connection the server closes is counted and opened again."""

    port: int
    count: int
    every: float
    cut_after: list[float] = field(default_factory=list)  # seconds from connect to the cut
    connect_failures: int = 0
    answered: int = 0  # connections on which the server wrote something before closing
    stop: threading.Event = field(default_factory=threading.Event)
    conns: dict[int, Conn] = field(default_factory=dict)
    thread: threading.Thread | None = None
    selector: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)

    def start(self) -> None:
        for _ in range(self.count):
            self._open()
        self.thread = threading.Thread(target=self._run, name="slowloris", daemon=True)
        self.thread.start()

    def connected(self) -> int:
        return len(self.conns)

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(10)
        for conn in list(self.conns.values()):
            self._drop(conn)
        self.selector.close()

    def _open(self) -> None:
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        except OSError:
            self.connect_failures += 1
            return
        try:
            sock.sendall(PREFIX)
        except OSError:
            sock.close()
            self.connect_failures += 1
            return
        sock.setblocking(False)
        conn = Conn(sock, time.monotonic())
        self.conns[sock.fileno()] = conn
        self.selector.register(sock, selectors.EVENT_READ, conn)

    def _drop(self, conn: Conn) -> None:
        self.conns.pop(conn.sock.fileno(), None)
        self.selector.unregister(conn.sock)
        conn.sock.close()

    def _cut(self, conn: Conn) -> None:
        self.cut_after.append(time.monotonic() - conn.opened)
        self._drop(conn)
        if not self.stop.is_set():
            self._open()

    def _run(self) -> None:
        next_tick = time.monotonic() + self.every
        while not self.stop.is_set():
            for key, _ in self.selector.select(timeout=0.05):
                self._read(key.data)
            if time.monotonic() >= next_tick:
                next_tick += self.every
                for conn in list(self.conns.values()):
                    self._send(conn)
            if len(self.conns) < self.count:
                self._open()  # one a turn, after connects that failed (each one counted)

    def _read(self, conn: Conn) -> None:
        try:
            data = conn.sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:  # a 4xx/5xx before closing: not what a header deadline does, but a cut
            self.answered += 1
        self._cut(conn)

    def _send(self, conn: Conn) -> None:
        try:
            conn.sock.send(bytes([DRIBBLE[conn.sent % len(DRIBBLE)]]))
            conn.sent += 1
        except BlockingIOError:
            pass
        except OSError:
            self._cut(conn)


def healthz(port: int) -> float:
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", "/healthz")
        answer = connection.getresponse()
        answer.read()
    finally:
        connection.close()
    if answer.status != 200:
        raise SystemExit(f"/healthz answered {answer.status}")
    return (time.perf_counter() - started) * 1000


def measure(port: int, slack: SlackClientSide, text: str, requests: int, seconds: float,
            pid: int) -> dict[str, list[float]]:
    """``requests`` GET /healthz and as many signed ``/runbook text``, alternated, spread over
    ``seconds`` (one pair per tick); milliseconds to each answer, and process ``pid``'s
    thread count at each tick."""
    found: dict[str, list[float]] = {"healthz": [], "command": [], "threads": []}
    tick = seconds / requests
    started = time.monotonic()
    for index in range(requests):
        found["healthz"].append(healthz(port))
        status, body, elapsed = slack.command(text, "U0ALICE")
        if status != 200:
            raise SystemExit(f"/runbook {text} answered {status}: {body[:200]}")
        found["command"].append(elapsed * 1000)
        found["threads"].append(threads_of(pid))
        pause = started + (index + 1) * tick - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    return found


def start_serve(config_file: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, RUNBOOK_CONFIG=str(config_file))
    serve = subprocess.Popen([sys.executable, "-m", "bot", "serve", "--port", str(port)],
                             env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).close()
            return serve
        except OSError:
            if serve.poll() is not None:
                sys.exit(f"runbook serve exited: {log.read_text()[-2000:]}")
            time.sleep(0.1)
    serve.kill()
    serve.wait()
    sys.exit("runbook serve did not answer /healthz within 60 s")


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def write_config(folder: Path, header_timeout: float | None) -> tuple[Path, float]:
    raw: dict[str, Any] = yaml.safe_load(Path(os.environ["RUNBOOK_CONFIG"]).read_text())
    raw.update(database_url=f"sqlite:///{folder / 'bot.db'}",
               runbook_paths=[str(shipped_runbooks())])
    server = raw.setdefault("server", {})
    if header_timeout is not None:
        server["header_timeout_seconds"] = header_timeout
    config_file = folder / "bot.yaml"
    config_file.write_text(yaml.safe_dump(raw))
    return config_file, float(server.get("header_timeout_seconds", 10.0))


def slow_process(port: int, count: int, every: float, pipe: Connection) -> None:
    """The slow clients, in a process of their own: sends how many are connected, runs until
    told to stop (or the benchmark is gone), then sends what happened."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ^C is the benchmark's to handle
    slow = SlowClients(port, count, every)
    try:
        slow.start()
        pipe.send(slow.connected())
        pipe.recv()
        connected = slow.connected()
    except (EOFError, BrokenPipeError):  # the benchmark stopped or died: so do we
        return
    finally:
        slow.close()
    cuts = slow.cut_after
    pipe.send({"connected_at_end": connected, "cuts": len(cuts),
               "cut_after_median_s": round(statistics.median(cuts), 2) if cuts else None,
               "cut_after_max_s": round(max(cuts), 2) if cuts else None,
               "answered_before_cut": slow.answered, "connect_failures": slow.connect_failures})


def attack(args: argparse.Namespace, port: int, slack: SlackClientSide, pid: int
           ) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """The timed requests while the slow clients (another process) hold their connections."""
    context = multiprocessing.get_context("spawn")
    pipe, child_end = context.Pipe()
    child = context.Process(target=slow_process, name="slowloris", daemon=True,
                            args=(port, args.slow, args.byte_every, child_end))
    child.start()
    child_end.close()  # the child's end lives in the child: our closing ours stops it
    try:
        if not pipe.poll(60):
            raise SystemExit("the slow clients did not connect within 60 s")
        connected = int(pipe.recv())
        time.sleep(min(2.0, args.byte_every * 2))  # every slow client has sent a header byte
        found = measure(port, slack, args.text, args.requests, args.seconds, pid)
        pipe.send("stop")
        if not pipe.poll(30):
            raise SystemExit("the slow clients did not stop within 30 s")
        slow: dict[str, Any] = pipe.recv()
    finally:
        pipe.close()
        child.join(15)
        if child.is_alive():
            child.kill()
            child.join()
    return found, {"connected": connected, **slow}


def report(args: argparse.Namespace, deadline: float, results: dict[str, dict[str, Any]],
           slow: dict[str, Any]) -> None:
    print(f"{'':<22}{'/healthz p50 / p99 / max ms':>32}{'/runbook ' + args.text:>34}")
    phases = (("baseline", "no slow clients"), ("slowloris", f"{args.slow} slow clients"))
    for phase, label in phases:
        row = [f"{results[phase][k]['p50_ms']:>8} {results[phase][k]['p99_ms']:>8} "
               f"{results[phase][k]['max_ms']:>8}" for k in ("healthz", "command")]
        print(f"{label:<22}{row[0]:>32}{row[1]:>34}")
    print(f"{args.requests} of each per phase over {args.seconds:g} s, one at a time")
    print(f"slow clients: {slow['connected']} connected at once ({slow['connected_at_end']} at "
          f"the end); the server cut {slow['cuts']} slow connections, median "
          f"{slow['cut_after_median_s']} s after they opened (max {slow['cut_after_max_s']} s; "
          f"header deadline {deadline:g} s); {slow['answered_before_cut']} answered before "
          f"the cut, {slow['connect_failures']} connects failed")
    print(f"runbook serve threads (most seen): {results['baseline']['serve_threads_max']} "
          f"with no slow client, {results['slowloris']['serve_threads_max']} with "
          f"{slow['connected']} slow connections open")
    goal = all(results["slowloris"][k]["p99_ms"] < GOAL_MS for k in ("healthz", "command"))
    print(f"goal p99 < {GOAL_MS:g} ms under slowloris: {'met' if goal else 'NOT met'}")
    finish("slowloris", {"bench": "slowloris", "slow_clients": args.slow,
                         "header_timeout_s": deadline, "requests": args.requests, **results,
                         "slow": slow, "goal_met": goal})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slow", type=int, default=200, help="slow clients at once")
    parser.add_argument("--requests", type=int, default=300, help="of each kind, per phase")
    parser.add_argument("--seconds", type=float, default=25.0, help="length of each phase")
    parser.add_argument("--byte-every", type=float, default=1.0)
    parser.add_argument("--text", default="help", help="the /runbook command sent")
    parser.add_argument("--header-timeout", type=float, default=None,
                        help="server.header_timeout_seconds (default: the configuration's)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))  # clean up as on ^C
    if not os.environ.get("SLACK_SIGNING_SECRET") or not os.environ.get("RUNBOOK_CONFIG"):
        sys.exit("needs the lab: deploy/lab/lab up && eval \"$(deploy/lab/lab env)\"")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        config_file, deadline = write_config(folder, args.header_timeout)
        port = free_port()
        serve = start_serve(config_file, port, folder / "serve.log")
        try:
            fake = FakeSlack(os.environ["SLACK_API_URL"].rsplit("/api", 1)[0])
            slack = SlackClientSide(f"http://127.0.0.1:{port}/slack/events",
                                    os.environ["SLACK_SIGNING_SECRET"], fake)
            measure(port, slack, args.text, 40, 0, serve.pid)  # warm up
            results = {"baseline": measure(port, slack, args.text, args.requests, args.seconds,
                                           serve.pid)}
            results["slowloris"], slow = attack(args, port, slack, serve.pid)
        finally:
            serve.terminate()
            try:
                serve.wait(30)
            except subprocess.TimeoutExpired:
                serve.kill()
                serve.wait()
        report(args, deadline, {phase: summary(found) for phase, found in results.items()},
               slow)


if __name__ == "__main__":
    main()
