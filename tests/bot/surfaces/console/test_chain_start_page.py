"""/ui/chain when the start of the chain is not proven (issue 28, section 1): each tampering
hidden behind the archive the log starts after shows on the page as it loads (the start,
the checkpoints against the archive file, the archive no event records), and "Verify now"
records it as broken."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.service import Service
from tests.bot.store.test_audit_chain_start import (
    EVERY,
    IN_THE_DATABASE,
    Log,
    Tamper,
    archived_log,
    forged_row,
    ids,
)
from tests.bot.surfaces.console.pagehelp import Element, as_user, client, overrides, parse
from tests.bot.surfaces.console.test_chain_page import RUNBOOK, chain, facts, verify_now
from tests.conftest import BotFactory


@pytest.fixture
def log(make_bot: BotFactory, tmp_path: Path) -> tuple[Service, Log]:
    points = tmp_path / "checkpoints" / "audit.jsonl"
    bot = make_bot({"demo": RUNBOOK}, **overrides(audit={"checkpoint_file": str(points)}))
    made = archived_log(bot.db, tmp_path, points)
    page = chain(bot)
    assert not page.all("p", "problem")
    assert "the log agrees with every checkpoint" in facts(page, "checkpoints")["Against the log"]
    return bot, made


def alerts(page: Element) -> list[str]:
    return [p.text() for p in page.all("p", "problem") if p.attrs.get("role") == "alert"]


@pytest.mark.parametrize(("tamper", "said"), EVERY, ids=ids(EVERY))
def test_the_page_shows_the_tampering_as_it_loads(log: tuple[Service, Log], tamper: Tamper,
                                                  said: str) -> None:
    bot, made = log
    tamper(made)
    page = chain(bot)
    against = facts(page, "checkpoints")["Against the log"]
    assert "✗" in against and said in against, against
    in_db = dict(IN_THE_DATABASE).get(tamper)
    if in_db:  # the start itself: said before anyone verifies
        assert any("the start of the log is not proven: " + in_db in a for a in alerts(page))


@pytest.mark.parametrize(("tamper", "said"), IN_THE_DATABASE, ids=ids(IN_THE_DATABASE))
def test_verify_now_records_the_unproven_start(log: tuple[Service, Log], tamper: Tamper,
                                               said: str) -> None:
    bot, made = log
    tamper(made)
    verify_now(bot)
    (status,) = [a for a in alerts(chain(bot)) if "when last verified" in a]
    assert "BROKEN" in status and said in status


def test_a_forged_archive_is_not_shown_as_made_by_whoever_its_row_names(
        log: tuple[Service, Log]) -> None:
    bot, made = log
    forged_row(made)
    page = parse(client(bot).get("/ui/chain", headers=as_user("erin")).text)
    section = next(s for s in page.all("section")
                   if s.attrs.get("aria-labelledby") == "archives")
    forged, real = [[cell.text() for cell in row.all("td")] for row in section.all("tr")[1:]]
    assert forged[0] == "6–7" and forged[5] == "–" and "✗ no audit_archived event" in forged[6]
    assert real[0] == "1–5" and real[5] == "auditor" and real[6] == "✓ event 9"
