"""Screenshots of the console's main pages at a laptop's size (1366x768), for docs/console.md
and the README: a site of demo executions run by the bot's engine (the browser tests' site,
tests/bot/surfaces/console/site.py), `runbook serve` on it, and Debian's Chromium, headless,
driven by Playwright. Run from the repository: .venv/bin/python docs/screenshots/take.py"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from playwright.sync_api import Page, sync_playwright  # noqa: E402

from tests.bot.surfaces.console import site as demo  # noqa: E402
from tests.bot.surfaces.console.test_browser import ARGS, CHROMIUM, LAPTOP  # noqa: E402

HERE = Path(__file__).parent


def shoot(page: Page, base: str, path: str, name: str, full: bool = False) -> None:
    answer = page.goto(f"{base}/ui{path}")
    assert answer is not None and answer.status == 200, (path, answer and answer.status)
    page.screenshot(path=HERE / f"{name}.png", full_page=full)
    print(f"docs/screenshots/{name}.png  {path}")


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        site = demo.seed(demo.make(Path(folder) / "site"))
        ids = site.ids
        with demo.serve(site) as base, sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            context = browser.new_context(viewport=LAPTOP, http_credentials={
                "username": "carol", "password": demo.PASSWORD})
            page = context.new_page()
            shoot(page, base, "/executions", "executions")
            shoot(page, base, f"/executions/{ids['burn-failed']}", "execution")
            shoot(page, base, "/nodes/gpu01", "node")
            page.goto(f"{base}/ui/chain")
            page.get_by_role("button", name="Verify now").click()
            page.wait_for_url("**/ui/chain")
            shoot(page, base, "/chain", "chain")
            shoot(page, base, "/runbooks/probe-node/diff?from=1.0.0&to=1.1.0", "runbook-diff")
            browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
