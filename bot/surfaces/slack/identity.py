"""Who a Slack user is to the bot: configured IDs, and user groups mapped to groups."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from bot.config import Config

log = logging.getLogger(__name__)


class Identities:
    def __init__(self, config: Config, client: Any) -> None:
        self._config = config
        self._client = client
        self._lock = threading.Lock()
        self._refreshed = 0.0

    def name(self, slack_user: str) -> str:
        """The bot's name for a Slack user: the configured one, else ``slack:<ID>``."""
        self.refresh_if_due()
        assert self._config.slack is not None
        return self._config.slack.users.get(slack_user, f"slack:{slack_user}")

    def refresh_if_due(self) -> None:
        slack = self._config.slack
        if slack is None or not slack.user_groups:
            return
        if time.monotonic() - self._refreshed < slack.groups_refresh_seconds:
            return
        with self._lock:
            if time.monotonic() - self._refreshed >= slack.groups_refresh_seconds:
                self.refresh()

    def refresh(self) -> None:
        """Ask Slack who is in each mapped user group; a failure keeps what was known."""
        slack = self._config.slack
        assert slack is not None
        learnt: dict[str, set[str]] = {}
        for usergroup, group in slack.user_groups.items():
            try:
                members = self._client.usergroups_users_list(usergroup=usergroup)["users"]
            except Exception as exc:  # Slack down: keep the previous memberships
                log.warning("cannot list Slack user group %s: %s", usergroup, exc)
                return
            for member in members:
                name = slack.users.get(member, f"slack:{member}")
                learnt.setdefault(name, set()).add(group)
        self._config.learn_groups(learnt)
        self._refreshed = time.monotonic()
