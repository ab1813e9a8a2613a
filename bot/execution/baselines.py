"""NCCL baselines in the database (``slurm.nccl_test``'s ``NcclBaselines``).

The first run of a shape of node set records its bus bandwidth; a second run racing it
finds the first one's (the key is the primary key) and is judged against it. Recording one
is an audit event in the same transaction.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError

from adapters.slurm.nccltest import Baseline
from bot.store import audit
from bot.store.db import now_iso
from bot.store.schema import nccl_baselines
from bot.store.words import Kind


class DatabaseBaselines:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def get(self, key: str) -> Baseline | None:
        with self._engine.connect() as conn:
            row = conn.execute(select(nccl_baselines)
                               .where(nccl_baselines.c.key == key)).first()
        return None if row is None else _baseline(row)

    def record(self, baseline: Baseline, replace: bool = False) -> Baseline:
        kept = Baseline(baseline.key, baseline.busbw, baseline.avg_busbw, baseline.nodes,
                        baseline.execution_id, now_iso())
        values = asdict(kept)
        try:
            with self._engine.begin() as conn:
                if replace:
                    conn.execute(nccl_baselines.delete()
                                 .where(nccl_baselines.c.key == baseline.key))
                elif conn.execute(select(nccl_baselines.c.key).where(
                        nccl_baselines.c.key == baseline.key)).first() is not None:
                    raise _Taken
                conn.execute(nccl_baselines.insert().values(**values))
                audit.append(conn, Kind.NCCL_BASELINE_RECORDED, "engine",
                             {**values, "replaced": replace}, baseline.execution_id)
        except (_Taken, IntegrityError):
            found = self.get(baseline.key)
            if found is None:  # gone again in between: nothing sane to compare with
                raise
            return found
        return kept


class _Taken(Exception):
    """Another run recorded this key first."""


def _baseline(row: Any) -> Baseline:
    return Baseline(row.key, row.busbw, row.avg_busbw, row.nodes, row.execution_id,
                    row.recorded_at)
