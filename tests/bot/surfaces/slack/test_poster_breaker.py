"""The breaker on automation says in the channel that it tripped: once per trip, whichever
replica's poster sees it first, and again after a reset and a new trip."""

from __future__ import annotations

from bot.alerts import breaker
from bot.surfaces.slack.poster import Poster
from tests.bot.alerts.test_remediation import make, ran
from tests.bot.surfaces.slack.test_poster_checkpoints import RecordingClient
from tests.conftest import BotFactory


def test_a_trip_is_posted_once_per_trip(make_bot: BotFactory) -> None:
    bot = make(make_bot, {"breaker": {"max_pool_share": 0.25, "max_nodes_per_hour": 100}})
    client = RecordingClient()
    first, second = Poster(bot, client, "C1", 1.0), Poster(bot, client, "C1", 1.0)
    first.tick()
    assert client.sent == []  # closed: nothing to say
    for node in ("gpu01", "gpu02"):
        ran(bot, "drain-node", node)
    assert breaker.stopped(bot) is not None
    first.tick()
    second.tick()  # another replica
    trips = [m for m in client.sent if "breaker on automation tripped" in m["text"]]
    assert len(trips) == 1 and trips[0]["channel"] == "C1"
    assert "2 of the 4 nodes of the slurm pool" in trips[0]["text"]
    assert "breaker reset" in trips[0]["text"]
    breaker.reset(bot, "carol", "known")
    for node in ("gpu03", "gpu01"):
        ran(bot, "drain-node", node)
    breaker.stopped(bot)
    first.tick()
    assert len([m for m in client.sent if "tripped" in m["text"]]) == 2
