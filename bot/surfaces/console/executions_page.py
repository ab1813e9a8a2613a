"""GET /ui/executions: the filtered, paged table of executions."""

from __future__ import annotations

from starlette.responses import Response

from bot.surfaces.console import listing
from bot.surfaces.console.app import Ask, PageRoute


def executions(ask: Ask) -> Response:
    flt = listing.parse(ask.query)
    size = ask.bot.config.console.page_size
    with ask.bot.db.connect() as conn:
        found = listing.page(conn, flt, ask.query.get("after"), size)
    return ask.page("executions.html", flt=flt, page=found)


ROUTES: list[PageRoute] = [("/executions", executions, ("GET",))]
