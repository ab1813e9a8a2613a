"""GET /ui/nodes and /ui/nodes/{name}: a node as Slurm, Kubernetes and its GPUs see it now
(bot.surfaces.nodeview; a system that fails or is not configured is shown as such), beside
every execution that touched it in either pool (``execution_nodes``: the node locks of each
plan, hostlists expanded), newest first."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from starlette.responses import RedirectResponse, Response

from bot.store import queries
from bot.store.db import Connection
from bot.surfaces import nodeview
from bot.surfaces.console.app import PREFIX, SECURITY_HEADERS, Ask, BadRequest, NotFound, PageRoute
from bot.surfaces.console.scope import visible
from kit import hostlist

NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")
SHOWN = 100  # executions on one page of a node
MAX_LISTED = 1000  # names a hostlist in the search may give


@dataclass(frozen=True)
class Touched:
    rows: list[dict[str, Any]]  # newest first
    older: int | None  # the ``before`` of the next page, when there is one


def nodes(ask: Ask) -> Response:
    """The node search: one name goes to its page; a hostlist or nothing lists nodes."""
    asked = ask.query.get("name", "").strip()
    if NAME.fullmatch(asked):
        return RedirectResponse(f"{PREFIX}/nodes/{quote(asked)}", 303, headers=SECURITY_HEADERS)
    known = sorted(ask.service.inventory.nodes)
    if asked:
        try:
            known = hostlist.expand(asked, limit=MAX_LISTED)
        except ValueError as exc:
            raise BadRequest(f"{asked[:80]!r} is neither a node name nor a hostlist: {exc}") \
                from None
    return ask.page("nodes.html", asked=asked, names=known,
                    inventory=ask.service.inventory)


def node(ask: Ask) -> Response:
    name = str(ask.path["name"])
    if not NAME.fullmatch(name):
        raise BadRequest(f"{name[:80]!r} is not a node name (letters, digits, '.', '_', '-')")
    before = _before(ask.query.get("before", ""))
    with ask.service.db.connect() as conn:
        touched = touching(conn, name, SHOWN, before, lambda rb: visible(
            ask.viewer, rb, ask.service.config))
    known = name in ask.service.inventory.nodes
    if not known and not touched.rows and before is None:
        raise NotFound(f"no node {name}: it is not in the bot's inventory and no execution "
                       "touched it")
    view, problems = _view(ask, name) if known else (None, [])
    return ask.page("node.html", name=name, known=known, view=view, problems=problems,
                    touched=touched, before=before, systems=_systems(ask, name))


def touching(conn: Connection, node: str, limit: int, before: int | None,
             may_see: Callable[[str], bool]) -> Touched:
    """The executions that locked ``node`` (newest first, IDs under ``before``), only those
    whose runbook ``may_see`` accepts."""
    rows = [_moved(row) for row in queries.touching(conn, node, limit + 1, before)]
    more = len(rows) > limit
    rows = rows[:limit]
    older = rows[-1]["id"] if more and rows else None
    return Touched([row for row in rows if may_see(row["runbook"])], older)


def _moved(row: dict[str, Any]) -> dict[str, Any]:
    """Only handoff-node's ``to`` of the parameters (others may be secret) stays."""
    params = row.pop("params", None)
    try:
        to = json.loads(params).get("to") if isinstance(params, str) else None
    except (ValueError, AttributeError):
        to = None
    row["to"] = to if isinstance(to, str) else None
    return row


def _view(ask: Ask, name: str) -> tuple[nodeview.NodeView | None, list[str]]:
    """The node now; a backend that raises anything is a problem to show, never a 500."""
    try:
        (view,) = nodeview.build(ask.service, [name])
    except Exception as exc:  # an unexpected failure of a backend: say so and go on
        return None, [f"the node view failed: {type(exc).__name__}: {exc}"]
    return view, list(view.problems)


def _systems(ask: Ask, name: str) -> dict[str, str]:
    """Why a system shows nothing for this node: not configured, or not in its pool."""
    inventory, backends = ask.service.inventory, ask.service.backends
    found = {}
    for system, label in (("slurm", "Slurm"), ("kubernetes", "Kubernetes")):
        # a hand-off node is known to both systems, whichever pool it serves now
        pool = getattr(inventory, f"in_{system}", getattr(inventory, system))
        if backends.get(system) is None:
            found[system] = f"{label} is not configured for the bot"
        elif name not in pool:
            found[system] = f"{name} is not in the {label} pool"
    if backends.get("prometheus") is None:
        found["gpus"] = "Prometheus is not configured for the bot: no GPU metrics"
    return found


def _before(text: str) -> int | None:
    if not text:
        return None
    if not text.isascii() or not text.isdigit() or len(text) > 19 or int(text) >= 2**63:
        raise BadRequest(f"before={text[:40]!r}: an execution ID is expected")
    return int(text)


ROUTES: list[PageRoute] = [("/nodes", nodes, ("GET",)), ("/nodes/{name}", node, ("GET",))]
