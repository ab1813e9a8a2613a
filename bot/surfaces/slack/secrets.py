"""Slack's secrets, from the environment or from files; never from the configuration file.

    SLACK_BOT_TOKEN       xoxb-... (or slack.bot_token_file)
    SLACK_SIGNING_SECRET  verifies HTTP requests (or slack.signing_secret_file)
    SLACK_APP_TOKEN       xapp-...: its presence selects Socket Mode (or slack.app_token_file)
    SLACK_API_URL         the Web API base URL (tests, proxies); default Slack's own
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bot.config import SlackConfig


class SlackSetupError(Exception):
    """Slack is half configured; the message says what is missing."""


@dataclass(frozen=True)
class SlackSecrets:
    bot_token: str = field(repr=False)
    signing_secret: str | None = field(repr=False)
    app_token: str | None = field(repr=False)
    api_url: str | None
    mode: str  # http | socket

    def values(self) -> list[str]:
        """Every secret, for making sure none is ever written anywhere."""
        return [v for v in (self.bot_token, self.signing_secret, self.app_token) if v]


def _read(env: Mapping[str, str], name: str, file: Path | None) -> str | None:
    value = env.get(name)
    if value:
        return value.strip()
    if file is None:
        return None
    try:
        return file.read_text().strip() or None
    except OSError as exc:
        raise SlackSetupError(f"cannot read the file for {name} ({file}): {exc.strerror}") from exc


def load(config: SlackConfig | None, env: Mapping[str, str] | None = None) -> SlackSecrets | None:
    """The secrets, or None when Slack is not set up at all (no bot token anywhere)."""
    env = os.environ if env is None else env
    bot_token = _read(env, "SLACK_BOT_TOKEN", config.bot_token_file if config else None)
    if bot_token is None:
        return None  # the slack: section may be deployed before its secrets
    if config is None:
        raise SlackSetupError("SLACK_BOT_TOKEN is set but the configuration has no slack: "
                              "section (it names the channel for approvals and proposals)")
    signing = _read(env, "SLACK_SIGNING_SECRET", config.signing_secret_file)
    app_token = _read(env, "SLACK_APP_TOKEN", config.app_token_file)
    mode = config.mode if config.mode != "auto" else ("socket" if app_token else "http")
    if mode == "socket" and not app_token:
        raise SlackSetupError("Socket Mode needs an app-level token (xapp-...): set "
                              "SLACK_APP_TOKEN or slack.app_token_file")
    if mode == "http" and not signing:
        raise SlackSetupError("HTTP mode needs the signing secret to verify requests: set "
                              "SLACK_SIGNING_SECRET or slack.signing_secret_file")
    return SlackSecrets(bot_token=bot_token, signing_secret=signing, app_token=app_token,
                        api_url=env.get("SLACK_API_URL") or None, mode=mode)
