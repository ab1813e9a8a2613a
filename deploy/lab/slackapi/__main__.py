"""`python3 -m slackapi --port N (--tokens-file F | --bot-token T --app-token T)
[--state FILE] [--log FILE] [--host H] [--manifest FILE]`.

The tokens file is JSON {"bot_token": "xoxb-...", "app_token": "xapp-..."} (other keys are
ignored); it keeps the tokens out of `ps`. The log never shows a token.
"""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from pathlib import Path
from types import FrameType

from . import scopes
from .server import SlackServer, Tokens


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="slackapi", description="The lab's fake of Slack's Web "
                                "API and Socket Mode.")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--tokens-file", type=Path, help="JSON with bot_token and app_token")
    p.add_argument("--bot-token", help="the bot token (xoxb-...)")
    p.add_argument("--app-token", help="the app-level token for Socket Mode (xapp-...)")
    p.add_argument("--state", type=Path, help="JSON state file: loaded when present, "
                   "written while running")
    p.add_argument("--log", type=Path, help="request log file (default: stderr)")
    p.add_argument("--manifest", type=Path, default=scopes.MANIFEST,
                   help="the Slack app manifest whose bot scopes the bot token is granted "
                   "(default: the shipped deploy/slack-app-manifest.yaml)")
    return p.parse_args(argv)


def tokens(args: argparse.Namespace) -> Tokens:
    bot, app = args.bot_token, args.app_token
    if args.tokens_file:
        data = json.loads(args.tokens_file.read_text())
        bot, app = bot or data.get("bot_token"), app or data.get("app_token")
    if not bot or not bot.startswith("xoxb-"):
        raise SystemExit("slackapi: a bot token xoxb-... is needed (--bot-token or "
                         "--tokens-file)")
    if not app or not app.startswith("xapp-"):
        raise SystemExit("slackapi: an app token xapp-... is needed (--app-token or "
                         "--tokens-file)")
    return Tokens(bot=bot, app=app)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    handler: logging.Handler = (logging.FileHandler(args.log) if args.log
                                else logging.StreamHandler())
    logging.basicConfig(level=logging.INFO, handlers=[handler],
                        format="%(asctime)s %(levelname)s %(message)s")
    server = SlackServer((args.host, args.port), tokens(args), args.state, args.manifest)

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    logging.info("slackapi listening on http://%s:%d (Web API at /api/, Socket Mode at "
                 "/socket)", args.host, args.port)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
