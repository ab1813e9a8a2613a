"""What the lock table tells people (bot.execution.locking): node locks shown as one
hostlist where the first of them was, who holds a lock and until when (in UTC), and a
maintenance window's hold, which is "past its end" from its end's very second.
"""

from __future__ import annotations

import pytest

from bot.execution import locking
from bot.store import db

WINDOW = locking.WindowHold(7, "gpu[01-02]", "open", "carol", 3, ends_at=2e9)


@pytest.mark.parametrize(("names", "shown"), [
    (["node:gpu01", "node:gpu02", "site"], ["node:gpu[01-02]", "site"]),
    (["site", "node:gpu01", "other", "node:gpu03"], ["site", "node:gpu[01,03]", "other"]),
    (["node:gpu01", "node:gpu02"], ["node:gpu[01-02]"]),
    (["node:gpu01", "site"], ["node:gpu01", "site"]),
    (["node:gpu 1", "node:gpu2"], ["node:gpu 1", "node:gpu2"]),  # no hostlist: as they are
    (["Node:gpu1", "Node:gpu2"], ["Node:gpu1", "Node:gpu2"]),  # not node locks
])
def test_node_locks_are_shown_as_one_hostlist(names: list[str], shown: list[str]) -> None:
    assert locking.compact(names) == shown


def test_a_held_lock_names_its_holder_and_its_expiry_in_utc(sqlite_url: str) -> None:
    engine = db.connect(sqlite_url)
    with engine.begin() as conn:
        locking.acquire(conn, ["node:gpu01"], 1, "alice", 2e9, 1e9)
        with pytest.raises(locking.LockConflict) as refused:
            locking.acquire(conn, ["node:gpu01"], 2, "bob", 2e9, 1e9)
    engine.dispose()
    assert str(refused.value).startswith("node:gpu01 is held by execution 1 (None, requested "
                                         "by alice) since ")
    assert str(refused.value).endswith("; it expires at 2033-05-18 03:33:20Z unless renewed")


def test_a_window_is_over_from_its_end_s_very_second() -> None:
    assert WINDOW.describe(now=2e9 - 1) == (
        "maintenance window 7 (open on gpu[01-02] until 2033-05-18 03:33 UTC, created by "
        "carol)")
    assert WINDOW.describe(now=2e9) == (
        "maintenance window 7 (open on gpu[01-02], past its end at 2033-05-18 03:33 UTC: it "
        "holds its nodes until its runs inside end and close-window has run; created by "
        "carol)")
