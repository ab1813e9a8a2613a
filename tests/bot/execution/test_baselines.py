"""NCCL baselines in the database (bot.execution.baselines), on SQLite and PostgreSQL: the first
run of a shape keeps its figure, a later or racing one gets the first one's back, rebaseline
replaces it, each recording is an audit event, and the assembled bot hands the store to
slurm.nccl_test."""

from __future__ import annotations

import threading

from sqlalchemy import select

from adapters.slurm.nccltest import Baseline, NcclTestAction
from bot.config import Config
from bot.execution.assembly import assemble
from bot.execution.baselines import DatabaseBaselines
from bot.store import audit, db
from bot.store.schema import nccl_baselines

KEY = "all_reduce_perf 2x8 NVIDIA H100 80GB HBM3 up to 1 GiB"


def test_the_first_baseline_stays_until_replaced(db_url: str) -> None:
    engine = db.connect(db_url)
    store = DatabaseBaselines(engine)
    assert store.get(KEY) is None
    first = store.record(Baseline(KEY, 186.6, 152.7, "gpu[01-02]", 12))
    assert first.recorded_at.endswith("Z") and first.busbw == 186.6
    assert store.get(KEY) == first
    later = store.record(Baseline(KEY, 95.9, 84.2, "gpu[03-04]", 13))
    assert later == first  # a second run is judged against the first, never becomes it
    replaced = store.record(Baseline(KEY, 191.2, 155.0, "gpu[05-06]", 14), replace=True)
    assert store.get(KEY) == replaced and replaced.execution_id == 14
    with engine.connect() as conn:
        assert conn.execute(select(nccl_baselines.c.key)).scalars().all() == [KEY]
        events = [e for e in audit.events(conn) if e["kind"] == "nccl_baseline_recorded"]
    assert [(e["execution_id"], e["data"]["busbw"], e["data"]["replaced"]) for e in events] \
        == [(12, 186.6, False), (14, 191.2, True)]
    assert audit.verify(engine).ok


def test_runs_racing_for_a_new_shape_all_get_one_baseline(db_url: str) -> None:
    store = DatabaseBaselines(db.connect(db_url))
    kept: list[Baseline] = []
    start = threading.Barrier(4)

    def record(execution_id: int) -> None:
        start.wait()
        kept.append(store.record(Baseline(KEY, 180.0 + execution_id, 150.0, "gpu01",
                                          execution_id)))

    threads = [threading.Thread(target=record, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(kept) == 4 and len(set(kept)) == 1 and kept[0] == store.get(KEY)


def test_the_assembled_bot_hands_its_store_to_slurm_nccl_test() -> None:
    config = Config.model_validate({"database_url": "sqlite://", "slurm": {}})
    engine = db.connect("sqlite://")
    parts = assemble(config, engine)
    action = parts.catalogue.get("slurm.nccl_test")
    assert isinstance(action, NcclTestAction)
    assert isinstance(action.baselines, DatabaseBaselines)
