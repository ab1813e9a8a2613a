"""Who a Slack user is to the bot: one person, one name.

A Slack user listed in ``slack.users`` is that person: the same name as on the command line
and in ``users``, ``requesters`` and ``approvers``, and the user groups of
``slack.user_groups`` give that person their groups. A Slack user not listed is nobody the
configuration knows: they act as ``slack:<ID>``, get no group from a user group, and may only
read (``slack.unmapped: readonly``) or also request (``requester``); never approve, deny or
confirm.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bot.config import UNMAPPED_PREFIX, Config
from bot.surfaces.chat import commands

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Person:
    slack_id: str
    name: str  # the configured name, else slack:<ID>
    mapped: bool  # listed in slack.users


class Identities:
    def __init__(self, config: Config, client: Any,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        self._client = client
        self._clock = clock
        self._lock = threading.Lock()
        self._refreshed: float | None = None  # None: the user groups were never read

    def who(self, slack_user: str) -> Person:
        """The person behind a Slack user (the user groups are read first when due)."""
        self.refresh_if_due()
        assert self._config.slack is not None
        name = self._config.slack.users.get(slack_user)
        return Person(slack_user, name or f"{UNMAPPED_PREFIX}{slack_user}", bool(name))

    def refusal(self, person: Person, line: str) -> str | None:
        """Why ``person`` may not say ``line`` (a line of the chat grammar), or None. Only a
        Slack user not in ``slack.users`` is refused here; the service decides the rest."""
        slack = self._config.slack
        assert slack is not None
        kind = commands.kind_of(line)
        if person.mapped or kind == "read" or (kind == "act" and slack.unmapped == "requester"):
            return None
        add = f"an administrator adds `{person.slack_id}: NAME` to slack.users"
        if kind == "decide":
            return ("only people the bot's configuration names may approve, deny or confirm, "
                    f"and your Slack user {person.slack_id} is not in slack.users: {add}")
        return (f"your Slack user {person.slack_id} is not in slack.users, so you may only "
                f"read ({', '.join(commands.READ_VERBS)}, schedule and window list and "
                f"show): {add}, or sets "
                "slack.unmapped: requester to let Slack users not listed there request runs")

    def refresh_if_due(self) -> None:
        slack = self._config.slack
        if slack is None or not slack.user_groups:
            return
        if not self._due(slack.groups_refresh_seconds):
            return
        with self._lock:
            if self._due(slack.groups_refresh_seconds):
                self.refresh()

    def _due(self, interval: float) -> bool:
        return self._refreshed is None or self._clock() - self._refreshed >= interval

    def refresh(self) -> None:
        """Ask Slack who is in each mapped user group; a failure keeps what was known.
        Members not in ``slack.users`` are left out: a group belongs to a person the
        configuration names, not to a Slack account."""
        slack = self._config.slack
        assert slack is not None
        learnt: dict[str, set[str]] = {}
        unmapped: set[str] = set()
        for usergroup, group in slack.user_groups.items():
            try:
                members = self._client.usergroups_users_list(usergroup=usergroup)["users"]
            except Exception as exc:  # Slack down: keep the previous memberships
                log.warning("cannot list Slack user group %s: %s", usergroup, exc)
                return
            for member in members:
                name = slack.users.get(member)
                if not name:
                    unmapped.add(member)
                else:
                    learnt.setdefault(name, set()).add(group)
        self._config.learn_groups(learnt)
        self._refreshed = self._clock()
        if unmapped:
            log.info("members of Slack user groups who are not in slack.users get no group: %s",
                     ", ".join(sorted(unmapped)[:20]))
