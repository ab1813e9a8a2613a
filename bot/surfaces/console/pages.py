"""Every page of the console: (path under /ui, handler, methods), and ``console``, the
application with all of them (here, not in app.py, which the pages import)."""

from __future__ import annotations

from starlette.applications import Starlette

from bot.service import Service
from bot.surfaces.console import (
    chain_page,
    execution_page,
    executions_page,
    node_page,
    runbooks_page,
)
from bot.surfaces.console.app import Console, PageRoute

ROUTES: list[PageRoute] = [*executions_page.ROUTES, *execution_page.ROUTES, *node_page.ROUTES,
                           *chain_page.ROUTES, *runbooks_page.ROUTES]


def console(service: Service) -> Starlette:
    """The console's application for ``bot``, with every page."""
    return Console(service, ROUTES).app()
