"""Questions to people during a run (``chat.confirm``), kept in the database.

The action asks once per execution and step (asking again after a restart keeps
an answer already given) and polls for the answer that ``runbook confirm`` or a
chat button records. Both the question and the answer are audit events.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Engine, select, update

from bot.store import audit
from bot.store.db import now_iso
from bot.store.schema import confirmations
from bot.store.words import Kind


class DatabaseConfirmations:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def ask(self, execution_id: int, step_id: str, question: str) -> None:
        with self._engine.begin() as conn:
            if pending(conn, execution_id, step_id) is not None:
                return
            conn.execute(confirmations.insert().values(
                execution_id=execution_id, step_id=step_id, question=question,
                asked_at=now_iso(),
            ))
            audit.append(conn, Kind.CONFIRMATION_REQUESTED, "engine",
                         {"step": step_id, "question": question}, execution_id)

    def answer(self, execution_id: int, step_id: str) -> tuple[str, str, str] | None:
        with self._engine.connect() as conn:
            row = pending(conn, execution_id, step_id)
        if row is None or row.answer is None:
            return None
        return row.answer, row.answered_by, row.note or ""


def pending(conn: Connection, execution_id: int, step_id: str | None = None) -> Any:
    query = select(confirmations).where(confirmations.c.execution_id == execution_id)
    if step_id is not None:
        query = query.where(confirmations.c.step_id == step_id)
    else:
        query = query.where(confirmations.c.answer.is_(None))
    return conn.execute(query).first()


def stale_answer(conn: Connection, execution_id: int, current_plan: str, question: Any,
                 step: str | None, plan_hash: str | None) -> str | None:
    """Why an answer given for ``step`` of the plan ``plan_hash`` (what a Yes/No button was
    posted for) does not answer ``question``, the one pending now (None: none is); None when
    it does, or when the answer names neither (``confirm ID`` on the command line)."""
    if plan_hash is not None and plan_hash != current_plan:
        return (f"execution {execution_id}: its plan changed since this question was posted; "
                "nothing was answered")
    if step is None or (question is not None and question.step_id == step):
        return None
    asked = pending(conn, execution_id, step)
    if asked is not None and asked.answer is not None:
        return (f"execution {execution_id}: the question of step {step} was answered already "
                f"({asked.answer}, by {asked.answered_by}); nothing was answered")
    now = (f"the question waiting now is step {question.step_id}'s: {question.question!r}"
           if question is not None else "no question is waiting now")
    return (f"execution {execution_id}: this answer is for step {step}, but {now}; nothing "
            "was answered")


def record_answer(conn: Connection, execution_id: int, step_id: str, answer: str, user: str,
                  note: str | None) -> None:
    conn.execute(
        update(confirmations)
        .where(confirmations.c.execution_id == execution_id, confirmations.c.step_id == step_id)
        .values(answer=answer, answered_by=user, answered_at=now_iso(), note=note)
    )
    audit.append(conn, Kind.CONFIRMED if answer == "yes" else Kind.CONFIRMATION_DECLINED, user,
                 {"step": step_id, "note": note}, execution_id)
