"""What the bot did to nodes, from its executions (the audit log's own record of each run and
the nodes it named): a node's remediations in a period (repeat offenders), the nodes its
runbooks hold out of service now and those it took out lately (the breaker)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection, select

from bot.store.schema import execution_nodes, executions
from bot.store.words import State

# an execution that ran (or runs): a remediation the node needed
RAN = frozenset({State.RUNNING, State.UNDOING, State.HELD, State.SUCCEEDED, State.FAILED})
# what holds a node out, by the runbook's ``remediation``: a drain until a resume
# succeeds; a repair while it runs, and after it failed (it leaves the node drained)
HOLDS_OUT = {
    "drain": frozenset({State.APPROVED, State.RUNNING, State.UNDOING, State.HELD,
                        State.SUCCEEDED}),
    "repair": frozenset({State.RUNNING, State.UNDOING, State.HELD, State.FAILED}),
}


def iso_ago(seconds: float) -> str:
    """The moment ``seconds`` ago, written as the executions table writes times."""
    moment = datetime.now(UTC) - timedelta(seconds=seconds)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def of_node(conn: Connection, node: str, runbooks: Collection[str],
            since: str) -> list[tuple[int, str]]:
    """(execution ID, runbook) of the ``runbooks`` that ran on ``node`` since ``since``."""
    if not runbooks:
        return []
    rows = conn.execute(
        select(executions.c.id, executions.c.runbook)
        .join(execution_nodes, execution_nodes.c.execution_id == executions.c.id)
        .where(execution_nodes.c.node == node, executions.c.runbook.in_(sorted(runbooks)),
               executions.c.requested_at >= since, executions.c.state.in_(sorted(RAN)))
        .order_by(executions.c.id))
    return [(int(row.id), str(row.runbook)) for row in rows]


def held_out(conn: Connection, kinds: Mapping[str, str], since: str = "") -> set[str]:
    """Nodes the bot's executions (requested since ``since``) hold out of service now: each
    node's latest execution of a runbook with a ``remediation`` (``kinds``: runbook ->
    drain, repair or resume) decides: a drain holds it out, a repair while it runs or after
    it failed; a repair or resume that succeeded returned it; anything else decides nothing."""
    if not kinds:
        return set()
    rows = conn.execute(
        select(execution_nodes.c.node, executions.c.runbook, executions.c.state)
        .join(executions, execution_nodes.c.execution_id == executions.c.id)
        .where(executions.c.runbook.in_(sorted(kinds)), executions.c.requested_at >= since)
        .order_by(executions.c.id.desc()))
    decided: dict[str, bool] = {}
    for node, runbook, state in rows:
        if node in decided:
            continue
        kind = kinds[runbook]
        if state == State.SUCCEEDED and kind in ("resume", "repair"):
            decided[node] = False  # returned to service
        elif kind != "resume" and state in HOLDS_OUT[kind]:
            decided[node] = True
    return {node for node, out in decided.items() if out}


def taken_out(conn: Connection, runbooks: Collection[str], since: str) -> set[str]:
    """Nodes that executions of ``runbooks`` (those that take nodes out) named since
    ``since``, once approved."""
    if not runbooks:
        return set()
    rows = conn.execute(
        select(execution_nodes.c.node).distinct()
        .join(executions, execution_nodes.c.execution_id == executions.c.id)
        .where(executions.c.runbook.in_(sorted(runbooks)), executions.c.requested_at >= since,
               executions.c.state.in_(sorted(RAN | {State.APPROVED}))))
    return {str(node) for node in rows.scalars()}
