"""The Slack scopes the bot's features need, checked once at start: Slack names the scopes a
token was granted in the ``x-oauth-scopes`` header of ``auth.test``. A missing scope turns
its features off (Slack answers ``missing_scope`` to their calls) and is logged as such; the
start never fails on it, and an answer without the header is logged as unknown, not guessed.
The app manifest (deploy/slack-app-manifest.yaml) grants every scope named here."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)
HEADER = "x-oauth-scopes"

# scope: what is off without it (each is a Web API method the bot calls, or Slack's own use)
FEATURES: dict[str, str] = {
    "commands": "the /runbook slash command",
    "chat:write": ("plans, approval buttons, progress, summaries and proposals in the channel "
                   "(chat.postMessage, chat.update) and answers to buttons (chat.postEphemeral)"),
    "chat:write.public": "posting to the channel before the bot is invited to it",
    "files:write": "charts in execution threads, e.g. fairshare-review's (files_upload_v2)",
    "usergroups:read": "approver groups from Slack user groups (slack.user_groups)",
}


def granted(headers: Mapping[str, Any]) -> frozenset[str] | None:
    """The scopes an answer's headers name; None when it names none (not Slack's answer)."""
    for key, value in headers.items():
        if key.lower() == HEADER:
            text = value[0] if isinstance(value, list | tuple) and value else value
            return frozenset(s.strip() for s in str(text).split(",") if s.strip())
    return None


def features_off(scopes: frozenset[str]) -> dict[str, str]:
    """scope: feature, for each scope the bot needs and was not granted."""
    return {scope: what for scope, what in FEATURES.items() if scope not in scopes}


def check(client: Any) -> dict[str, str] | None:
    """Ask Slack (auth.test) which scopes the bot token has and log the features off; the
    features off (scope: feature), or None when the scopes could not be learnt."""
    try:
        answer = client.auth_test()
        scopes = granted(dict(answer.headers or {}))
    except Exception as exc:  # the start goes on; Bolt has checked the token already
        log.warning("cannot read the Slack token's scopes (auth.test: %s)", exc)
        return None
    if scopes is None:
        log.warning("Slack did not name the token's scopes (no %s header on auth.test)",
                    HEADER)
        return None
    off = features_off(scopes)
    for scope, what in off.items():
        log.warning("Slack scope %s not granted: off: %s. Add it to the app's scopes "
                    "(deploy/slack-app-manifest.yaml) and reinstall the app", scope, what)
    if not off:
        log.info("Slack scopes: every feature on (%s)", ",".join(sorted(scopes)))
    return off
