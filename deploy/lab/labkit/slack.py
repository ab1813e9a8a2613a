"""The lab's Slack (deploy/lab/slackapi) as a lab daemon, and its per-lab secrets.

- `slack` (port base +391): `python3 -m slackapi`, Slack's Web API at
  http://127.0.0.1:PORT/api/ (SLACK_API_URL: keep the trailing slash), Socket Mode at
  ws://127.0.0.1:PORT/socket, control endpoints under /_lab/.
- Secrets: $LAB/etc/slack.json (mode 0600), made once per lab folder: a bot token
  `xoxb-lab-...`, an app-level token `xapp-lab-...` and a signing secret (hex). The fake
  accepts exactly these tokens; requests to the bot are signed with the secret
  (labkit/slackclient.py).
"""
from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path

from .daemons import Daemon, http_status
from .layout import Info, Layout, Ports

NAME = "slack"
CHANNEL = "C0RUNBOOK"
CHANNEL_NAME = "gpu-ops"
TEAM_ID = "T0LAB"
APP_ID = "A0LAB"
BOT_USER = "U0BOT"
EVENTS_PATH = "/slack/events"
LAB_DIR = Path(__file__).resolve().parent.parent


def secrets_file(layout: Layout) -> Path:
    return layout.etc / "slack.json"


def state_file(layout: Layout) -> Path:
    return layout.state / "slack.json"


def url(ports: Ports) -> str:
    return f"http://127.0.0.1:{ports.service(NAME)}"


def api_url(ports: Ports) -> str:
    return f"{url(ports)}/api/"


def events_url(ports: Ports) -> str:
    """Where Slack would send slash commands and interactions: the bot's HTTP server."""
    return f"http://127.0.0.1:{ports.service('bot')}{EVENTS_PATH}"


def ensure_secrets(layout: Layout) -> dict[str, str]:
    """The lab's Slack secrets, created (mode 0600 from the start) when missing."""
    path = secrets_file(layout)
    if path.exists():
        data: dict[str, str] = json.loads(path.read_text())
        return data
    data = {
        "bot_token": f"xoxb-lab-{secrets.token_hex(4)}-{secrets.token_hex(12)}",
        "app_token": f"xapp-lab-{APP_ID}-{secrets.token_hex(16)}",
        "signing_secret": secrets.token_hex(16),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(data, out, indent=2)
        out.write("\n")
    return data


def read_secrets(layout: Layout) -> dict[str, str] | None:
    try:
        data: dict[str, str] = json.loads(secrets_file(layout).read_text())
    except (OSError, ValueError):
        return None
    return data


def daemon(layout: Layout, ports: Ports) -> Daemon:
    port = ports.service(NAME)
    env = dict(os.environ, PYTHONPATH=str(LAB_DIR), PYTHONDONTWRITEBYTECODE="1")

    def ready() -> bool:
        return http_status(f"{url(ports)}/_lab/health") == 200

    def prepare() -> None:
        ensure_secrets(layout)

    return Daemon(
        name=NAME,
        argv=[sys.executable, "-m", "slackapi", "--port", str(port),
              "--tokens-file", str(secrets_file(layout)), "--state", str(state_file(layout)),
              "--log", str(layout.log / "slack.log")],
        env=env, port=port, logs=[layout.log / "slack.log", layout.log / "slack.out"],
        ready=ready, prepare=prepare,
    )


def fresh_state(layout: Layout) -> None:
    """`lab up` starts an empty workspace; `lab service slack start` keeps the state."""
    state_file(layout).unlink(missing_ok=True)


def env_exports(layout: Layout, info: Info) -> dict[str, str]:
    """SLACK_API_URL, SLACK_BOT_TOKEN, SLACK_SIGNING_SECRET and LAB_SLACK_APP_TOKEN.
    Not SLACK_APP_TOKEN: its presence switches the bot to Socket Mode."""
    slack = info.get("slack")
    data = read_secrets(layout)
    if not slack or not data:
        return {}
    return {"SLACK_API_URL": slack["api_url"], "SLACK_BOT_TOKEN": data["bot_token"],
            "SLACK_SIGNING_SECRET": data["signing_secret"],
            "LAB_SLACK_APP_TOKEN": data["app_token"]}


def info(layout: Layout, ports: Ports) -> Info:
    return {"url": url(ports), "api_url": api_url(ports),
            "socket_url": f"ws://127.0.0.1:{ports.service(NAME)}/socket",
            "channel": CHANNEL, "channel_name": CHANNEL_NAME, "team_id": TEAM_ID,
            "app_id": APP_ID, "bot_user_id": BOT_USER,
            "bot_events_url": events_url(ports), "tokens_file": str(secrets_file(layout)),
            "state_file": str(state_file(layout)), "log": str(layout.log / "slack.log")}
