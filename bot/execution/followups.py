"""What a failed execution leaves for people: the proposal its plan names
(``propose_on_failure``, reset-gpu's swap-gpu), recorded in the transaction that ends the
execution, so a crash never leaves one without the other."""

from __future__ import annotations

import re

from sqlalchemy import Connection, select

from bot.store import audit
from bot.store.db import now_iso
from bot.store.schema import proposals, step_states
from bot.store.words import Kind
from kit.canonical import canonical

FOLLOW_UP_USER = "bot"  # who proposes what a failed execution's plan names
DIAGNOSED_GPU = re.compile(r"\bGPU:\s*(\d+)\b")  # how dcgmi diag names a failing GPU


def propose(conn: Connection, execution_id: int, runbook: str,
            follow_up: dict[str, object] | None, error: str | None) -> int | None:
    """Record the open proposal a failed execution's plan names; its ID, or None."""
    if not follow_up or not _failed_where_asked(conn, execution_id, follow_up):
        return None
    now = now_iso()
    given = follow_up.get("params")
    params, named = _diagnosed_gpu(dict(given) if isinstance(given, dict) else {}, error or "")
    note = f"{runbook} (execution {execution_id}) failed: {error or 'no error recorded'}"
    note = f"{named}. {note}" if named else note
    result = conn.execute(proposals.insert().values(
        fingerprint=f"execution-{execution_id}", alertname=f"{runbook} failed",
        labels=canonical({"execution": str(execution_id), "runbook": runbook}),
        runbook=str(follow_up["runbook"]), params=canonical(params), state="open",
        alert_status="firing", created_at=now, updated_at=now, note=note[:2000]))
    key = result.inserted_primary_key
    assert key is not None
    proposal_id = int(key[0])
    audit.append(conn, Kind.PROPOSED, FOLLOW_UP_USER, {
        "proposal": proposal_id, "after_execution": execution_id,
        "runbook": follow_up["runbook"], "params": params, "reason": note[:2000]},
        execution_id)
    return proposal_id


def _diagnosed_gpu(params: dict[str, object], error: str) -> tuple[dict[str, object], str]:
    """The GPU the diagnostic named (dcgmi's ``Fail - GPU: 5``), when it is one and the
    proposal names another: the GPU to swap is the failing one, not the one reset."""
    named = set(DIAGNOSED_GPU.findall(error))
    if "gpu" not in params or len(named) != 1 or str(params["gpu"]) in named:
        return params, ""
    gpu = named.pop()
    said = f"the diagnostic named GPU {gpu}, not GPU {params['gpu']}: proposed for GPU {gpu}"
    return {**params, "gpu": gpu}, said


def _failed_where_asked(conn: Connection, execution_id: int,
                        follow_up: dict[str, object]) -> bool:
    """``after_step``: only when that step (or one of those) failed, not a wait for jobs, a
    drain or a check."""
    steps = follow_up.get("after_step")
    if not steps:
        return True
    wanted = [steps] if isinstance(steps, str) else [
        str(step) for step in steps] if isinstance(steps, list) else []
    failed = conn.execute(select(step_states.c.step_id).where(
        step_states.c.execution_id == execution_id, step_states.c.phase == "do",
        step_states.c.step_id.in_(wanted), step_states.c.state == "failed")).first()
    return failed is not None
