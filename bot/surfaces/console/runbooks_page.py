"""GET /ui/runbooks, /ui/runbooks/{name} and /ui/runbooks/{name}/diff?from=V1&to=V2: the
runbooks (loaded now, or only recorded), each one's versions with when the bot first saw
them, and any two versions side by side. Texts are masked like every page's."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import yaml
from starlette.responses import Response

from bot.execution.planning import approval_policy
from bot.runbooks import versions
from bot.runbooks.loading import LoadedRunbook, RunbookError
from bot.runbooks.model import NAME
from bot.service import Service
from bot.store import queries
from bot.surfaces.console import sidebyside
from bot.surfaces.console.app import Ask, BadRequest, NotFound, PageRoute
from bot.surfaces.console.scope import masked_text, secret_values_in, visible
from bot.surfaces.rendering import describe_text


@dataclass(frozen=True)
class Listed:
    name: str
    loaded: LoadedRunbook | None  # None: recorded, but no file has it now
    versions: int  # recorded


def runbooks(ask: Ask) -> Response:
    loaded, problem = _loaded(ask.service)
    with ask.service.db.connect() as conn:
        recorded = queries.version_counts(conn)
    rows = [Listed(name, loaded.get(name), recorded.get(name, 0))
            for name in sorted(set(loaded) | set(recorded))
            if visible(ask.viewer, name, ask.service.config)]
    return ask.page("runbooks.html", rows=rows, problem=problem)


def runbook(ask: Ask) -> Response:
    name = _name(ask)
    loaded, problem = _loaded(ask.service)
    with ask.service.db.connect() as conn:
        found = versions.listing(conn, name)
    current = loaded.get(name)
    if current is None and not found:
        raise NotFound(f"no runbook {name}")
    described = ""
    if current:
        policy = approval_policy(current.runbook, ask.service.config)
        described = masked_text(describe_text(current, policy.describe()), _secrets(current.source))
    newest_first = list(reversed(found))
    before = {later.version: earlier.version for earlier, later in itertools.pairwise(found)}
    return ask.page("runbook.html", name=name, current=current, described=described,
                    versions=newest_first, before=before, problem=problem)


def diff(ask: Ask) -> Response:
    name = _name(ask)
    with ask.service.db.connect() as conn:
        found = versions.listing(conn, name)
        if not found:
            raise NotFound(f"no runbook {name} was ever recorded")
        new = ask.query.get("to", "").strip() or found[-1].version
        old = ask.query.get("from", "").strip() or getattr(
            versions.before(conn, name, new), "version", new)
        try:
            first, second = versions.pair(conn, name, old[:64], new[:64])
        except KeyError as exc:
            raise NotFound(str(exc.args[0])) from None
    hidden = _secrets(first.source) | _secrets(second.source)
    rows = sidebyside.rows(masked_text(first.source, hidden), masked_text(second.source, hidden))
    return ask.page("runbook_diff.html", name=name, old=first, new=second, rows=rows,
                    versions=list(reversed(found)),
                    changed=sum(row.change != "same" for row in rows))


def _name(ask: Ask) -> str:
    name = str(ask.path["name"])
    if not NAME.fullmatch(name):
        raise BadRequest(f"{name[:80]!r} is not a runbook name (lower-case letters, digits, -)")
    if not visible(ask.viewer, name, ask.service.config):
        raise NotFound(f"no runbook {name}")
    return name


def _secrets(source: str) -> frozenset[str]:
    """The secret values in a runbook's text (a secret-looking parameter's default)."""
    try:
        return secret_values_in(yaml.safe_load(source))
    except yaml.YAMLError:
        return frozenset()


def _loaded(service: Service) -> tuple[dict[str, LoadedRunbook], str]:
    """The runbooks loaded now, and the problem that keeps them from loading, if any."""
    try:
        return service.runbooks(), ""
    except RunbookError as exc:
        return {}, str(exc)


ROUTES: list[PageRoute] = [("/runbooks", runbooks, ("GET",)),
                           ("/runbooks/{name}", runbook, ("GET",)),
                           ("/runbooks/{name}/diff", diff, ("GET",))]
