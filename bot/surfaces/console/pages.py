"""Every page of the console: (path under /ui, handler, methods)."""

from __future__ import annotations

from bot.surfaces.console import (
    chain_page,
    execution_page,
    executions_page,
    node_page,
    runbooks_page,
)
from bot.surfaces.console.app import PageRoute

ROUTES: list[PageRoute] = [*executions_page.ROUTES, *execution_page.ROUTES, *node_page.ROUTES,
                           *chain_page.ROUTES, *runbooks_page.ROUTES]
