"""Every page of the console: (path under /ui, handler, methods)."""

from __future__ import annotations

from bot.surfaces.console import executions_page
from bot.surfaces.console.app import PageRoute

ROUTES: list[PageRoute] = [*executions_page.ROUTES]
