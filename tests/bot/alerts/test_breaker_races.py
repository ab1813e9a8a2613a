"""The breaker decided by two OS processes at the same moment (two replicas receiving alerts):
each trial takes two nodes out, both processes ask ``breaker.stopped`` together behind a
barrier, and exactly one ``breaker_tripped`` event must be recorded, both told to stop. On
PostgreSQL (the advisory lock decides) and on a SQLite file (BEGIN IMMEDIATE)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import yaml

from bot.alerts import breaker
from bot.config import load_config
from bot.service import Service
from bot.store import audit, db
from bot.store.words import Kind

SPAWN = multiprocessing.get_context("spawn")
TRIALS = {"postgres": 15, "sqlite": 5}
WAIT = 60.0
DRAIN = {"name": "drain-node", "version": "1.0.0", "summary": "takes a node out",
         "risk": "low", "remediation": "drain",
         "params": {"node": {"type": "node", "required": True}},
         "steps": [{"id": "say", "action": "chat.notify", "with": {"message": "out"}}]}


def _config(tmp_path: Path, url: str) -> Path:
    folder = tmp_path / "runbooks"
    folder.mkdir()
    (folder / "drain-node.yaml").write_text(yaml.safe_dump(DRAIN, sort_keys=False))
    path = tmp_path / "bot.yaml"
    path.write_text(yaml.safe_dump({
        "lab": True, "database_url": url, "runbook_paths": [str(folder)],
        "users": {"alice": {"groups": ["oncall"]}, "carol": {"groups": ["leads"]}},
        "requesters": ["group:oncall"], "approvers": ["group:leads"],
        "inventory": {"nodes": ["gpu01", "gpu02", "gpu03"], "discover": False},
        "remediation": {"breaker": {"max_nodes_per_hour": 1}}}))
    db.init(url)  # `runbook db init`: the bot's commands never create the database
    return path


def _worker(config_path: str, trials: int, barrier: Any, results: Any) -> None:
    bot = Service.from_config(load_config(config_path))
    bot.runbooks()
    for _ in range(trials):
        barrier.wait(WAIT)  # the parent took two nodes out
        barrier.wait(WAIT)  # both ask at once
        results.put(breaker.stopped(bot) is not None)
        barrier.wait(WAIT)  # the parent counts and resets


def _trips(bot: Service) -> int:
    with bot.db.connect() as conn:
        return sum(1 for e in audit.events(conn) if e["kind"] == Kind.BREAKER_TRIPPED)


def test_two_replicas_trip_the_breaker_once(db_url: str, tmp_path: Path) -> None:
    path = _config(tmp_path, db_url)
    bot = Service.from_config(load_config(path))
    trials = TRIALS["postgres" if db_url.startswith("postgresql") else "sqlite"]
    barrier, results = SPAWN.Barrier(3), SPAWN.Queue()
    workers = [SPAWN.Process(target=_worker, args=(str(path), trials, barrier, results))
               for _ in range(2)]
    for worker in workers:
        worker.start()
    try:
        for trial in range(trials):
            taken = [bot.request("drain-node", {"node": node}, "alice")
                     for node in ("gpu01", "gpu02")]
            barrier.wait(WAIT)
            barrier.wait(WAIT)
            told = [results.get(timeout=WAIT) for _ in range(2)]
            assert told == [True, True], f"trial {trial}: both must be told to stop"
            assert _trips(bot) == trial + 1, f"trial {trial}: the trip must be recorded once"
            for execution_id in taken:
                bot.cancel(execution_id, "alice")
            breaker.reset(bot, "carol", f"trial {trial} done")
            barrier.wait(WAIT)
    finally:
        for worker in workers:
            worker.join(WAIT)
            if worker.is_alive():
                worker.kill()
    assert all(worker.exitcode == 0 for worker in workers)
    assert audit.verify(bot.db).ok
