"""The compact line of a step over many nodes: counts and hostlists per state, cut short
where a chat message would overflow."""

from __future__ import annotations

from adapters.actions import ActionContext
from adapters.fleetstatus import NodeStates
from bot.surfaces.fleet_text import fleet_line, node_status
from kit import hostlist

STATES = ("drained", "draining", "blocked by PDB", "failed", "not started")


def states_of(nodes: list[str]) -> NodeStates:
    published: list[object] = []
    ctx = ActionContext(execution_id=1, step_id="k8s-drain", deadline=0.0,
                        status=published.append)
    return NodeStates(nodes, ctx, STATES, "not started", clock=lambda: 0.0)


def test_the_line_shows_counts_and_hostlists_per_state() -> None:
    nodes = hostlist.expand("gpu[001-128]")
    states = states_of(nodes)
    for name in nodes[:40]:
        states.set(name, "drained")
    for name in nodes[40:56]:
        states.set(name, "draining")
    states.set("gpu057", "blocked by PDB", "serving/web-1: PodDisruptionBudget serving/pdb")
    line = fleet_line(states.snapshot())
    assert line == ("drained 40/128 gpu[001-040] · draining 16 gpu[041-056] · blocked by PDB 1 "
                    "gpu057 · failed — · not started 71 gpu[058-128] (gpu057: serving/web-1: "
                    "PodDisruptionBudget serving/pdb)")


def test_a_scattered_set_is_cut_short_and_a_result_is_read_from_its_details() -> None:
    nodes = [f"n{i}x" for i in range(0, 400, 2)]  # no two in a row: a long hostlist
    states = states_of(nodes)
    line = fleet_line(states.snapshot())
    assert line.startswith("drained 0/200 — · draining —") and line.endswith("…")
    assert len(line) < 250
    result = {"summary": "s", "details": {"status": states.snapshot()}, "changed": True}
    assert node_status(result) == states.snapshot()
    assert node_status({"summary": "s", "details": {}}) is None


def test_publish_hands_over_a_change_at_most_once_a_second() -> None:
    now = [0.0]
    published: list[object] = []
    ctx = ActionContext(execution_id=1, step_id="s", deadline=0.0, status=published.append)
    states = NodeStates(["a1", "a2"], ctx, STATES, "not started", clock=lambda: now[0])
    states.publish()
    states.set("a1", "drained")
    states.publish()  # too soon: held back
    now[0] = 1.0
    states.publish()
    states.publish()  # nothing changed
    assert len(published) == 2
