"""``runbook config check`` and ``runbook db init``: a site's first commands, before it runs
anything. They print what they find and return the exit code; the judging is in
bot.execution.config_check, the making in bot.store.db."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

_Add = Callable[[str, str], argparse.ArgumentParser]
EXIT_OK, EXIT_BAD_INPUT = 0, 2


def add_commands(add: _Add) -> None:
    p = add("config", "check the configuration: the files it names, its runbooks, and what "
                      "the configured systems cannot do (exit 0 only when nothing is wrong)")
    p.add_argument("action", choices=["check"])
    p.add_argument("--config", dest="check_config", metavar="FILE",
                   help="the file to check (default: --config before the command, "
                        "$RUNBOOK_CONFIG, else the built-in defaults)")
    p.add_argument("--offline", action="store_true",
                   help="contact no server (without it, Slurm and Kubernetes are asked to "
                        "list their nodes, and slurmrestd what it can do)")
    p = add("db", "init: create the database (or bring its schema up to date); the only "
                  "command that creates one, unless the configuration says database: "
                  "{create: true}")
    p.add_argument("action", choices=["init"])


def cmd_config(args: argparse.Namespace) -> int:
    from bot.config import CONFIG_ENV, ConfigError, load_config
    from bot.execution import config_check

    chosen = args.check_config or args.config or os.environ.get(CONFIG_ENV)
    name = chosen or "(no configuration file: the built-in defaults)"
    try:
        config = load_config(chosen)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"error: {problem}")
        print(f"{name}: {len(exc.problems)} problem(s)")
        return EXIT_BAD_INPUT
    ask, problems = (None, []) if args.offline else config_check.servers(config)
    report = config_check.check(config, ask=ask)
    report.problems[:0] = problems
    for problem in report.problems:
        print(f"error: {problem}")
    for runbook, needs in sorted(report.unavailable.items()):
        print(f"not available here: {runbook}: needs {', '.join(needs)}")
    for runbook, needs in sorted(report.partial.items()):
        print(f"in part here: {runbook}: its steps under when: need {', '.join(needs)}")
    for note in report.notes:
        print(f"note: {note}")
    for operation, runbooks in sorted(report.unknown.items()):
        print(f"not checked: {operation} ({', '.join(sorted(runbooks))}): only slurmrestd "
              "can say whether its API version has it; pin slurm.rest.api_version, or check "
              "without --offline")
    verdict = "ok" if not report.problems else f"{len(report.problems)} problem(s)"
    print(f"{name}: {verdict} ({report.files} files and folders, {report.runbooks} runbooks, "
          f"{len(report.unavailable)} not available here, {len(report.partial)} in part"
          f"{', offline' if args.offline else ''})")
    sys.stdout.flush()
    return EXIT_OK if not report.problems else EXIT_BAD_INPUT


def cmd_db(args: argparse.Namespace) -> int:
    """``db init``: the one command that creates the database. The folder of a SQLite file
    must be there, except the bot's own state folder of the default database."""
    from pathlib import Path

    from bot.config import DB_URL_ENV, load_config
    from bot.store import db

    config = load_config(args.config)
    url = config.resolved_database_url()
    if config.database_url is None and not os.environ.get(DB_URL_ENV):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    made = db.init(url)
    shown = db.shown_url(url)
    print(f"created the database {shown} (schema {db.HEAD_REVISION})" if made else
          f"the database {shown} is there (schema {db.HEAD_REVISION}): nothing created")
    return EXIT_OK
