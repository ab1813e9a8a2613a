"""``runbook audit``: verify the hash chain (and the checkpoints, or an archive file),
record a checkpoint, archive the old events, export events. It prints what it finds and
returns the exit code; the proving is in bot.store (audit, checkpoints, archive). Refused:
a bad date or file (exit 2 on the command line)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kit.errors import Refused

if TYPE_CHECKING:
    from bot.config import Config

_Add = Callable[[str, str], argparse.ArgumentParser]
EXIT_OK, EXIT_FAILED = 0, 1


def add_commands(add: _Add) -> None:
    p = add("audit", "verify or export the audit log")
    audit_sub = p.add_subparsers(dest="audit_command", required=True, metavar="ACTION")
    v = audit_sub.add_parser("verify", help="check the hash chain; exit 1 naming the first bad "
                             "event")
    v.add_argument("--checkpoints", nargs="?", const="", default=None, metavar="FILE",
                   help="also compare the log with the checkpoints in FILE (default: "
                        "audit.checkpoint_file): a cut or rewritten tail fails")
    v.add_argument("--archive", metavar="FILE",
                   help="prove an archive file (runbook audit archive) instead of the log")
    audit_sub.add_parser("checkpoint", help="append the log's head to audit.checkpoint_file now")
    a = audit_sub.add_parser("archive", help="move the events before a date into a verified "
                             "file; the log keeps proving the rest")
    a.add_argument("--before", required=True, help="ISO date or time (UTC), exclusive")
    a.add_argument("--output", required=True, metavar="FILE", help="a new file")
    e = audit_sub.add_parser("export", help="write events as JSON lines or CSV")
    e.add_argument("--since", help="ISO date or time (UTC), inclusive")
    e.add_argument("--until", help="ISO date or time (UTC), exclusive")
    e.add_argument("--change", metavar="REF",
                   help="only the events of the executions requested with change=REF")
    e.add_argument("--format", choices=["jsonl", "csv"], default="jsonl")
    e.add_argument("--output", help="file to write (default: standard output)")


def _config(args: argparse.Namespace) -> Config:
    from bot.config import load_config

    return load_config(args.config)


def cmd_audit(args: argparse.Namespace) -> int:
    from bot.store import audit
    from bot.store.db import READ_ONLY, connect

    config = _config(args)
    engine = connect(config.resolved_database_url(), create=config.database.create)
    if args.audit_command == "checkpoint":
        return _checkpoint(engine, _checkpoint_file(config, ""))
    if args.audit_command == "archive":
        return _archive(engine, args)
    if args.audit_command == "verify" and args.archive:
        return _verify_archive(args.archive)
    if args.audit_command == "verify":
        verdict = audit.verify(engine)
        if not verdict.ok:
            print(f"audit log BROKEN: {verdict.problem} (after {verdict.events} good events)")
            return EXIT_FAILED
        print(f"audit log intact: {verdict.events} events, head {verdict.head}")
        if args.checkpoints is None:
            return EXIT_OK
        return _verify_checkpoints(engine, _checkpoint_file(config, args.checkpoints))
    since, until = _iso(args.since), _iso(args.until)
    with engine.connect() as conn:
        conn.execution_options(**READ_ONLY)  # a long export holds no writer back (SQLite)
        rows = audit.events(conn, since=since, until=until,
                            executions_of=_of_change(args.change))
        if args.output:
            with open(args.output, "w", newline="") as out:
                count = audit.export(rows, out, args.format)
            print(f"wrote {count} events to {args.output}", file=sys.stderr)
        else:
            audit.export(rows, sys.stdout, args.format)
    return EXIT_OK


def _of_change(change: str | None) -> Any:
    """The IDs of the executions requested with this change reference (None: no filter)."""
    if change is None:
        return None
    from bot.store import listing

    return listing.ids_of_change(change)


def _archive(engine: Any, args: argparse.Namespace) -> int:
    from pathlib import Path

    from bot.config import current_user
    from bot.store import archive

    before = _iso(args.before)
    assert before is not None
    try:
        done = archive.archive(engine, before, Path(args.output), current_user())
    except archive.ArchiveError as exc:
        raise Refused(str(exc)) from None
    print(f"archived events {done.from_seq}-{done.up_to_seq} to {done.file} (sha256 "
          f"{done.sha256}); the log now starts after head {done.head_hash}")
    return EXIT_OK


def _verify_archive(file: str) -> int:
    from pathlib import Path

    from bot.store import archive

    try:
        proved = archive.verify_file(Path(file))
    except archive.ArchiveError as exc:
        print(f"archive BROKEN: {exc}")
        return EXIT_FAILED
    print(f"archive intact: events {proved.from_seq}-{proved.up_to_seq}, head "
          f"{proved.head_hash}, sha256 {proved.sha256}")
    return EXIT_OK


def _checkpoint_file(config: Config, given: str) -> Path:
    if given:
        return Path(given)
    if config.audit.checkpoint_file is None:
        raise Refused("name the checkpoint file (--checkpoints FILE) or set "
                         "audit.checkpoint_file in the configuration")
    return config.audit.checkpoint_file


def _checkpoint(engine: Any, path: Path) -> int:
    from bot.store import checkpoints

    try:
        point = checkpoints.record(engine, path)
    except checkpoints.CheckpointError as exc:
        raise Refused(str(exc)) from None
    print(f"checkpoint: event {point.seq}, hash {point.hash}" if point
          else f"the last checkpoint in {path} already has the log's head")
    return EXIT_OK


def _verify_checkpoints(engine: Any, path: Path) -> int:
    from bot.store import checkpoints

    try:
        count, problems = checkpoints.check(engine, path)
    except checkpoints.CheckpointError as exc:
        raise Refused(str(exc)) from None
    for problem in problems:
        print(f"audit log BROKEN: {problem}")
    if problems:
        return EXIT_FAILED
    print(f"checkpoints agree: {count} in {path}")
    return EXIT_OK


def _iso(value: str | None) -> str | None:
    from bot.store.audit import moment

    if value is None:
        return None
    try:
        return moment(value)  # the console's time filters read times the same way
    except ValueError:
        raise Refused(f'"{value}" is not an ISO date or time (like 2026-11-30 or '
                         "2026-11-30T10:00:00Z)") from None
