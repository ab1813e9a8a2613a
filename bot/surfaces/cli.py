"""``runbook``: the command line. It only translates; bot.service does the work.

Heavy modules (SQLAlchemy, pydantic, Jinja2) are imported inside the commands
so that ``runbook --help`` starts fast.

Exit codes: 0 success; 2 bad input or a refused request (nothing was done);
1 the execution failed, was denied, expired or was cancelled.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from bot.store.words import State
from bot.surfaces import audit_commands, setup_commands

if TYPE_CHECKING:
    from bot.config import Config
    from bot.runtime.startup import Plugin
    from bot.service import Service
    from bot.surfaces.slack.surface import SlackSurface

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


_Add = Callable[[str, str], argparse.ArgumentParser]  # adds one subcommand


class UsageError(Exception):
    """Bad input on the command line: exit 2 with the message."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="runbook",
        description="Run versioned, approved and audited runbooks on GPU clusters.",
        epilog="Exit codes: 0 success, 2 bad input or refused (nothing done), "
               "1 the execution failed or was denied.",
    )
    parser.add_argument("--config", help="configuration file (default: $RUNBOOK_CONFIG, "
                                         "else built-in defaults)")
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="print the version of runbook and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_text, description=help_text)

    _runbook_commands(add)
    _decision_commands(add)
    _reading_commands(add)
    _version_and_process_commands(add)
    _node_and_proposal_commands(add)
    _worker_commands(add)
    _output_commands(add)
    setup_commands.add_commands(add)  # config check, db init
    return parser


class _Version(argparse.Action):
    """``--version``: from the installed package's metadata, read only when asked."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("gpu-runbook-bot")
        except PackageNotFoundError:
            found = "unknown (not installed)"
        print(f"runbook {found}")
        parser.exit()


def _json(parser: argparse.ArgumentParser,
          text: str = "print JSON (shapes: docs/json-output.md)") -> None:
    parser.add_argument("--json", action="store_true", help=text)


def _output_commands(add: _Add) -> None:
    """Completion (and the other commands for tools and editors)."""
    p = add("completion", "print the shell completion script (bash or zsh): "
                          'eval "$(runbook completion bash)"')
    p.add_argument("shell", choices=["bash", "zsh", "words"])
    p.add_argument("--line", help=argparse.SUPPRESS)  # words: the line so far (bash)
    p.add_argument("words", nargs="*", help=argparse.SUPPRESS)  # words: the words (zsh)
    p = add("schema", "print the JSON Schema of runbook files or of the configuration "
                      "(editors: docs/schema/)")
    p.add_argument("kind", choices=["runbook", "config"])
    p = add("docs", "print a reference page made from the code: actions (docs/actions.md)")
    p.add_argument("page", choices=["actions"])


def _runbook_commands(add: _Add) -> None:
    """List, describe, validate, plan, run."""
    _json(add("list", "list the runbooks"))
    p = add("describe", "show a runbook's parameters, policy and steps")
    p.add_argument("name")
    _json(p)
    p = add("validate", "validate runbook files (default: the configured runbooks)")
    p.add_argument("paths", nargs="*")
    _json(p)
    for name, text in (("plan", "print the plan and its hash; changes nothing"),
                       ("run", "request an execution (prints its ID first)")):
        p = add(name, text)
        p.add_argument("name")
        p.add_argument("params", nargs="*", metavar="key=value",
                       help="the runbook's parameters; change=REF: a change or incident "
                            "reference (policy.require_change)")
        p.add_argument("--break-glass", action="store_true",
                       help="override the capacity guard (needs one more approval)")
        if name == "plan":
            _json(p)
        if name == "run":
            p.add_argument("--wait", action="store_true",
                           help="wait for approval and drive the execution to its end here")
            p.add_argument("--as", dest="as_user", help="act as USER (lab configs only)")


def _decision_commands(add: _Add) -> None:
    """Confirm, approve, deny, cancel, resume."""
    p = add("confirm", "answer the question a running step asks (chat.confirm)")
    p.add_argument("id", type=int)
    p.add_argument("--no", action="store_true", help="answer no: the step fails")
    p.add_argument("--note", help="a note kept in the audit log")
    p.add_argument("--as", dest="as_user", help="act as USER (lab configs only)")
    for name, text in (("approve", "approve an execution"), ("deny", "deny an execution"),
                       ("cancel", "cancel an execution (undoes completed steps)"),
                       ("resume", "resume an execution held for a person")):
        p = add(name, text)
        p.add_argument("id", type=int)
        p.add_argument("--as", dest="as_user", help="act as USER (lab configs only)")
        if name == "deny":
            p.add_argument("--reason")
        if name == "approve":  # the plan the approver saw: refused if it is not the plan now
            p.add_argument("plan_hash", nargs="?", metavar="PLAN_HASH",
                           help="the first 6+ characters of the plan hash you looked at")


def _reading_commands(add: _Add) -> None:
    """Status, show, history; audit (bot.surfaces.audit_commands)."""
    for name, text in (("status", "one execution's state"),
                       ("show", "one execution's timeline from the audit log")):
        p = add(name, text)
        p.add_argument("id", type=int)
        _json(p)
    p = add("history", "past and current executions")
    p.add_argument("--node")
    p.add_argument("--runbook")
    p.add_argument("--user")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--json", action="store_true")
    audit_commands.add_commands(add)  # audit verify, checkpoint, archive, export


def _version_and_process_commands(add: _Add) -> None:
    """Versions, diff, serve, chat."""
    p = add("versions", "the versions of a runbook the bot has seen")
    p.add_argument("name")
    _json(p)
    p = add("diff", "what changed between two versions of a runbook")
    p.add_argument("name")
    p.add_argument("v1")
    p.add_argument("v2")
    p = add("serve", "the bot's HTTP server (/alerts, /healthz, /metrics, /slack/events), "
                     "Slack, and on the leader the engine and the scheduler")
    p.add_argument("--host", help="address to listen on (default: server.host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default: server.port, 8080)")
    p.add_argument("--init-db", action="store_true",
                   help="create the database when it is not there (runbook db init), for an "
                        "image or a pod whose database is made at its first start")
    p = add("console", "the web console at /ui of serve: hash-password reads a password "
                       "(twice at a terminal, else one line of stdin) and prints the hash "
                       "console.basic takes")
    p.add_argument("action", choices=["hash-password"])
    p = add("chat", "the chat grammar at a terminal (script mode when stdin is not a terminal)")
    p.add_argument("--as", dest="as_user", help="start as USER (lab configs only)")


def _node_and_proposal_commands(add: _Add) -> None:
    """Node, proposals, proposal."""
    p = add("node", "one or more nodes as Slurm, Kubernetes and the GPUs see them")
    p.add_argument("names", nargs="*", help="node names or hostlists (gpu[01-04]); "
                                            "none: every node the bot knows")
    p.add_argument("--json", action="store_true")
    p = add("proposals", "runbooks proposed by alerts, waiting for a person")
    p.add_argument("--all", action="store_true", help="also dismissed and started ones")
    p.add_argument("--json", action="store_true")
    p = add("proposal", "act on a proposal: run it (as a request) or dismiss it")
    p.add_argument("action", choices=["run", "dismiss"])
    p.add_argument("id", type=int)
    p.add_argument("--reason")
    p.add_argument("--as", dest="as_user", help="act as USER (lab configs only)")
    p = add("breaker", "the breaker on automation: status, or reset it (approvers)")
    p.add_argument("action", choices=["status", "reset"])
    p.add_argument("--reason", help="reset: why automation may act again")
    p.add_argument("--json", action="store_true")
    p.add_argument("--as", dest="as_user", help="act as USER (lab configs only)")


def _worker_commands(add: _Add) -> None:
    """Engine, schedule, window."""
    p = add("engine", "drive approved and interrupted executions (the worker)")
    p.add_argument("--once", action="store_true", help="return when nothing is left to run")
    p = add("schedule", 'run a runbook later: add NAME key=value... cron="0 2 * * SAT"|'
                        'at="2026-12-05 02:00" [tz=ZONE] [approve=ahead]; list [all]; '
                        "show|approve|pause|resume|remove ID")
    p.add_argument("words", nargs="+", metavar="WORD")
    p.add_argument("--as", dest="as_user", help="act as USER (lab configs only)")
    _json(p, "list and show: JSON (docs/json-output.md)")
    p = add("window", 'maintenance windows: create NODES start=... duration=... '
                      '[runbooks="NAME k=v; ..."] [reason=...]; list [all]; '
                      "show|approve|open|cancel ID")
    p.add_argument("words", nargs="+", metavar="WORD")
    p.add_argument("--as", dest="as_user", help="act as USER (lab configs only)")
    p.add_argument("--wait", action="store_true",
                   help="open/cancel: drive the window's executions here until it is open "
                        "with its runbooks done, or closed")
    _json(p, "list and show: JSON (docs/json-output.md)")


# A command's start (imports, models, the configuration) makes objects by the hundred thousand
# and hardly any cycles: collecting every 700 of them took 60-70 ms of each start, 12-18 ms
# every 50,000. The collector's own thresholds are back once the service is assembled (_bot),
# and at the end; a command that never assembles one still collects, less often.
GC_THRESHOLDS = gc.get_threshold()
GC_WHILE_STARTING = 50_000


def main(argv: Sequence[str] | None = None) -> int:
    # the bot uses no pydantic plugin; looking for them reads every installed package's
    # entry points at the first model, a tenth of a command's cold start (set it to "" to
    # let pydantic look)
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    gc.set_threshold(GC_WHILE_STARTING, *GC_THRESHOLDS[1:])
    args = _parser().parse_args(argv)
    try:
        return int(_COMMANDS[args.command](args))
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `runbook history | head`: the reader has what it wanted
        _quiet_stdout()
        return 0
    except Exception as exc:
        code = _known_error(exc)
        if code is None:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return code
    finally:
        gc.set_threshold(*GC_THRESHOLDS)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so flushing it at exit raises no second BrokenPipeError."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _known_error(exc: Exception) -> int | None:
    from bot.config import ConfigError
    from bot.runbooks.loading import RunbookError
    from bot.runbooks.params import ParamError
    from bot.store.db import DatabaseError
    from kit.errors import Refused

    if isinstance(exc, ConfigError | RunbookError | ParamError | Refused | DatabaseError):
        return EXIT_BAD_INPUT
    return None


# --- wiring -------------------------------------------------------------------------------


def _config(args: argparse.Namespace) -> Config:
    from bot.config import load_config

    return load_config(args.config)


def _bot(args: argparse.Namespace, config: Config | None = None) -> Service:
    from bot.service import Service

    # the adapters are built, and the pools listed, when a command first needs them
    service = Service.from_config(config or _config(args), on_problems=_warn)
    gc.set_threshold(*GC_THRESHOLDS)  # started: the command's work collects as usual
    return service


def _warn(problems: list[str]) -> None:
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)


def _user(args: argparse.Namespace, service: Service) -> str:
    from bot.config import current_user

    wanted = getattr(args, "as_user", None)
    if wanted is None:
        return current_user()
    if not service.config.lab:
        raise UsageError("--as is only honoured when the configuration says lab: true")
    return str(wanted)


def _report(execution_id: int, line: str) -> None:
    print(f"[{execution_id}] {line}", flush=True)


# --- commands --------------------------------------------------------------------------------


def cmd_list(args: argparse.Namespace) -> int:
    from bot.surfaces import json_output

    service = _bot(args)
    if args.json:
        return _print_json([json_output.runbook_item(loaded)
                            for _, loaded in sorted(service.runbooks().items())])
    for name, loaded in sorted(service.runbooks().items()):
        rb = loaded.runbook
        print(f"{name:<22} {rb.version:<10} {rb.risk:<7} {rb.summary}")
    return EXIT_OK


def cmd_describe(args: argparse.Namespace) -> int:
    from bot.execution.planning import approval_policy
    from bot.surfaces import json_output
    from bot.surfaces.rendering import describe_text

    service = _bot(args)
    loaded = service.runbook(args.name)
    policy = approval_policy(loaded.runbook, service.config).describe()
    if args.json:
        return _print_json(json_output.describe(loaded, policy))
    print(describe_text(loaded, policy))
    return EXIT_OK


def cmd_validate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from bot.config import shipped_runbooks
    from bot.runbooks.catalogue import KNOWN
    from bot.runbooks.loading import RunbookError, load_all
    from bot.surfaces import json_output

    config = _config(args)
    paths = [Path(p) for p in args.paths] or config.runbook_paths
    try:
        found = load_all(paths, {name: known[0] for name, known in KNOWN.items()},
                         config.host_commands, exempt=shipped_runbooks())
    except RunbookError as exc:
        if not args.json:
            raise
        print(json_output.dumps(json_output.validation([], exc.problems)))
        return EXIT_BAD_INPUT
    if not found:
        raise UsageError(f"no runbook files in {', '.join(str(p) for p in paths)}")
    _warn(_unlisted_host_commands(config, found.values()))
    if args.json:
        return _print_json(json_output.validation(
            [loaded for _, loaded in sorted(found.items())], []))
    for name, loaded in sorted(found.items()):
        print(f"ok  {loaded.path}  {name} {loaded.runbook.version}")
    return EXIT_OK


def _unlisted_host_commands(config: Config, found: Any) -> list[str]:
    """The shipped runbooks' host commands this configuration does not list (host_commands):
    not a problem of the files, but they cannot run here until it does."""
    from bot.config import shipped_runbooks
    from bot.runbooks.loading import named_host_commands

    shipped = shipped_runbooks().resolve()
    notes = []
    for loaded in found:
        missing = sorted({command for _, command in named_host_commands(loaded.runbook)
                          if command not in config.host_commands})
        if missing and shipped in loaded.path.resolve().parents:
            notes.append(f"{loaded.name} runs the host command(s) {', '.join(missing)}, which "
                         "the configuration does not list (host_commands): it cannot run "
                         "here until it does")
    return notes


def cmd_plan(args: argparse.Namespace) -> int:
    from bot.surfaces import json_output
    from bot.surfaces.chat.words import parse_assignments
    from bot.surfaces.rendering import plan_text
    from bot.surfaces.secret_prompt import filled

    service = _bot(args)
    raw = filled(service, args.name, parse_assignments(args.params))
    plan = service.plan(args.name, raw, break_glass=args.break_glass)
    if args.json:
        return _print_json(json_output.plan(plan))
    print(plan_text(plan))
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    from bot.runbooks.params import ParamError
    from bot.surfaces.chat.words import parse_assignments
    from bot.surfaces.secret_prompt import filled
    from kit.errors import Refused

    service = _bot(args)
    user = _user(args, service)
    try:
        raw = parse_assignments(args.params)
    except ParamError as exc:  # still one audit event for the refused request
        service.record_refused(args.name, user, "cli", str(exc))
        raise Refused(str(exc)) from exc
    raw = filled(service, args.name, raw)  # NAME=- for a secret: read, not typed on the line
    execution_id = service.request(args.name, raw, user, break_glass=args.break_glass)
    ex = service.get(execution_id)
    print(f"execution {execution_id}", flush=True)
    print(f"{ex.runbook} {ex.version} requested by {user}; plan hash {ex.plan_hash}")
    if ex.state == State.AWAITING_APPROVAL:
        print(f"awaiting approval: {ex.plan.approval.describe()} "
              f"(runbook approve {execution_id} {ex.plan_hash[:12]})", flush=True)
    if not args.wait:
        if ex.state == State.APPROVED:
            print("queued: the engine runs it (runbook engine); follow with "
                  f"`runbook status {execution_id}`")
        return EXIT_OK
    return _drive(service, execution_id)




def _drive(service: Service, execution_id: int) -> int:
    from bot.execution.engine import Engine

    engine = Engine(service, report=_report)
    try:
        ex = engine.drive(execution_id, wait_for_approval=True)
        while not ex.terminal and ex.state != State.HELD:  # another engine has it: follow it
            engine.sleep(service.config.engine.poll_seconds)
            ex = engine.drive(execution_id, wait_for_approval=True)
    finally:
        engine.close()
    print(f"execution {execution_id}: {ex.state}" + (f" — {ex.error}" if ex.error else ""))
    return EXIT_OK if ex.state == State.SUCCEEDED else EXIT_FAILED


def _decide(args: argparse.Namespace, verb: str) -> int:
    service = _bot(args)
    user = _user(args, service)
    if verb == "approve":
        ex = service.approve(args.id, user, plan_hash=args.plan_hash)
        got = len(service.approvals(ex.id))
        print(f"execution {ex.id}: approved by {user} ({got}/{ex.approvals_required}), "
              f"plan {ex.plan_hash[:12]}; now {ex.state}")
    elif verb == "deny":
        ex = service.deny(args.id, user, args.reason)
        print(f"execution {ex.id}: denied by {user}; nothing was run")
    elif verb == "cancel":
        ex = service.cancel(args.id, user)
        print(f"execution {ex.id}: " + ("cancelled" if ex.terminal else
                                         "cancel requested: it stops at the next step "
                                         "boundary and undoes completed steps"))
    elif verb == "confirm":
        question = service.confirm(args.id, user, not args.no, args.note)
        print(f"execution {args.id}: {user} answered {'no' if args.no else 'yes'} to "
              f"{question!r}")
    else:
        ex = service.resume(args.id, user)
        print(f"execution {ex.id}: resume requested; the engine continues it")
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    from bot.surfaces import json_output
    from bot.surfaces.rendering import status_text

    service = _bot(args)
    ex = service.get(args.id)
    if args.json:
        return _print_json(json_output.execution(ex, service.approvals(ex.id),
                                                 service.step_states(ex.id)))
    print(status_text(ex, service.approvals(ex.id), service.step_states(ex.id)))
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    from bot.surfaces import json_output
    from bot.surfaces.rendering import status_text, timeline_text

    service = _bot(args)
    ex, events = service.timeline(args.id)
    if args.json:
        return _print_json(json_output.timeline(ex, service.approvals(ex.id),
                                                service.step_states(ex.id), events))
    print(status_text(ex, service.approvals(ex.id), service.step_states(ex.id)))
    print()
    print(timeline_text(events))
    return EXIT_OK


def cmd_history(args: argparse.Namespace) -> int:
    import json

    service = _bot(args)
    found = service.history(runbook=args.runbook, user=args.user, node=args.node,
                            limit=args.limit)
    if args.json:
        print(json.dumps([_history_row(ex) for ex in found], indent=2))
        return EXIT_OK
    from bot.runbooks.params import params_text

    for ex in found:
        row = _history_row(ex)
        params = params_text(ex.params)
        print(f"{row['id']:>6}  {row['requested_at'][:19]}  {row['state']:<17} "
              f"{row['runbook']:<18} {row['requested_by']:<10} {params}")
    return EXIT_OK


def _history_row(ex: Any) -> dict[str, Any]:
    return {"id": ex.id, "runbook": ex.runbook, "version": ex.version, "state": ex.state,
            "requested_by": ex.requested_by, "requested_at": ex.requested_at,
            "finished_at": ex.finished_at, "params": ex.params, "error": ex.error}


def cmd_versions(args: argparse.Namespace) -> int:
    from bot.surfaces import json_output

    service = _bot(args)
    service.runbooks()
    found = service.versions_of(args.name)
    if not found:
        raise UsageError(f'the bot has never seen a runbook "{args.name}"')
    if args.json:
        return _print_json([json_output.plain(version) for version in found])
    for version in found:
        print(f"{version.version:<12} sha256 {version.content_hash}  first seen "
              f"{version.first_seen}")
    return EXIT_OK


def cmd_diff(args: argparse.Namespace) -> int:
    service = _bot(args)
    service.runbooks()
    try:
        text = service.version_diff(args.name, args.v1, args.v2)
    except KeyError as exc:
        raise UsageError(str(exc.args[0])) from None
    print(text or f"{args.name} {args.v1} and {args.v2} have the same text")
    return EXIT_OK


def cmd_engine(args: argparse.Namespace) -> int:
    from bot.execution.engine import Engine

    service = _bot(args)
    service.runbooks()
    engine = Engine(service, report=_report)
    try:
        engine.run_pending(once=args.once)
    finally:
        engine.close()
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    """Assembled in bot.runtime.startup; the surfaces it serves are plugged in here."""
    from bot.runtime import startup

    options = startup.Options(host=args.host, port=args.port, init_db=args.init_db)
    try:
        startup.run(_config(args), options, lambda config: _bot(args, config), _plugins)
    except startup.StartError as exc:
        raise UsageError(str(exc)) from None
    return EXIT_OK


def _plugins(service: Service) -> list[Plugin]:
    """What serve offers beyond its own routes: Slack (when set up) and the console."""
    from bot.runtime.startup import Plugin
    from bot.surfaces.console.pages import console

    slack = _slack_surface(service)
    chat = Plugin(note="; Slack not set up") if slack is None else Plugin(
        routes=dict(slack.routes()), tasks=list(slack.tasks()), report=slack.report,
        checkpoint_post=slack.poster.checkpoint, note=f"; Slack in {slack.mode} mode")
    # the read-only console; it refuses all without identity
    return [chat, Plugin(mounts={"/ui": console(service)}, shown=["/ui/"])]


def cmd_console(args: argparse.Namespace) -> int:
    import getpass

    from bot.surfaces.console.passwords import hash_password

    if sys.stdin.isatty():
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            raise UsageError("the two passwords differ; nothing printed")
    else:
        password = sys.stdin.readline().rstrip("\n")
    if len(password) < 12:
        raise UsageError("a console password must be at least 12 characters")
    print(hash_password(password))
    return EXIT_OK


def _slack_surface(service: Service) -> SlackSurface | None:
    from bot.surfaces.slack.secrets import SlackSetupError
    from bot.surfaces.slack.surface import from_environment

    try:
        return from_environment(service)
    except SlackSetupError as exc:
        raise UsageError(f"Slack: {exc}") from exc


def cmd_chat(args: argparse.Namespace) -> int:
    from bot.surfaces.chat.terminal import run_chat

    service = _bot(args)
    service.runbooks()
    user = _user(args, service)
    scripted = None if sys.stdin.isatty() else sys.stdin
    return run_chat(service, user, lines=scripted)


def cmd_node(args: argparse.Namespace) -> int:
    import json

    from bot.surfaces import nodeview
    from bot.surfaces.nodeparts import node_parts

    service = node_parts(_config(args))  # what the view reads, no more: a quick start
    for warning in service.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    names = _node_names(args.names) or sorted(service.inventory.nodes)
    unknown = [name for name in names if name not in service.inventory.nodes]
    if unknown:
        raise UsageError(f"not known node(s): {', '.join(unknown)}")
    views = nodeview.build(service, names)
    if args.json:
        print(json.dumps([view.__dict__ for view in views], indent=2, default=str))
    else:
        print("\n\n".join(nodeview.text(view) for view in views))
    return EXIT_OK


def _node_names(given: list[str]) -> list[str]:
    """The names given, each a name or a hostlist (``gpu[01-04]``), in order, once each."""
    from kit import hostlist

    names: dict[str, None] = {}
    for item in given:
        try:
            names.update(dict.fromkeys(hostlist.expand(item)))
        except ValueError as exc:
            raise UsageError(f"{item}: {exc}") from None
    return list(names)


def cmd_proposals(args: argparse.Namespace) -> int:
    import json
    import time
    from datetime import datetime

    from bot import commands
    from bot.runbooks.params import params_text

    service = _bot(args)
    found = commands.list_proposals(service, open_only=not args.all)
    if args.json:
        print(json.dumps([p.__dict__ for p in found], indent=2))
        return EXIT_OK
    if not found:
        print("no open proposals" if not args.all else "no proposals")
    for p in found:
        since = datetime.fromisoformat(p.created_at.replace("Z", "+00:00")).timestamp()
        age = _age(time.time() - since)
        node = p.labels.get("node") or p.labels.get("Hostname") or p.labels.get("hostname", "-")
        resolved = ", alert resolved" if p.alert_status == "resolved" else ""
        print(f"{p.id:>5}  {p.state:<9} {p.alertname:<22} {node:<8} {p.runbook:<12} "
              f"{params_text(p.params)}  ({age} ago{resolved})")
        if p.note:
            print(f"       {p.note}")
    return EXIT_OK


def cmd_breaker(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    from bot import commands
    from bot.alerts import breaker

    service = _bot(args)
    if args.action == "reset":
        now = commands.reset_breaker(service, _user(args, service), args.reason or "")
    else:
        now = commands.breaker_status(service)
    if args.json:
        print(json.dumps(dataclasses.asdict(now), indent=2))
    else:
        print(breaker.status_text(now))
    return EXIT_OK


def _age(seconds: float) -> str:
    from kit.durations import format_duration

    return format_duration(max(1, int(seconds)))


def cmd_proposal(args: argparse.Namespace) -> int:
    from bot import commands

    service = _bot(args)
    user = _user(args, service)
    if args.action == "run":
        execution_id = commands.run_proposal(service, args.id, user)
        print(f"execution {execution_id}")
        ex = service.get(execution_id)
        print(f"proposal {args.id}: {ex.runbook} requested by {user}; now {ex.state}")
    else:
        commands.dismiss_proposal(service, args.id, user, args.reason)
        print(f"proposal {args.id}: dismissed by {user}")
    return EXIT_OK


def cmd_scheduled(args: argparse.Namespace, noun: str) -> int:
    """``runbook schedule ...`` and ``runbook window ...``: the chat grammar's verbs."""
    from bot.surfaces.chat import scheduled

    service = _bot(args)
    service.runbooks()
    user = _user(args, service)
    words = list(args.words)
    if args.json:
        return _scheduled_json(service, noun, words)
    if noun == "schedule":
        reply = scheduled.schedule(service, words, user, source="cli")
    else:
        reply = scheduled.window(service, words, user)
    print(reply.text, file=sys.stdout if reply.ok else sys.stderr)
    if not reply.ok:
        return EXIT_BAD_INPUT
    if (noun == "window" and args.wait and len(words) == 2 and words[0] in ("open", "cancel")
            and words[1].isdigit()):
        return _follow_window(service, int(words[1]))
    return EXIT_OK


def _scheduled_json(service: Service, noun: str, words: list[str]) -> int:
    """``schedule|window list [all] --json`` (a list) and ``show ID --json`` (one)."""
    from bot import commands
    from bot.surfaces import json_output

    shape: Any = json_output.schedule if noun == "schedule" else json_output.window
    listing: Any = commands.list_schedules if noun == "schedule" else commands.list_windows
    one: Any = commands.get_schedule if noun == "schedule" else commands.get_window
    if words[0] == "list" and words[1:] in ([], ["all"]):
        return _print_json([shape(found) for found in
                            listing(service, everything=words[1:] == ["all"])])
    if words[0] == "show" and len(words) == 2 and words[1].isdigit():
        return _print_json(shape(one(service, int(words[1]))))
    raise UsageError(f"--json shows {noun}s: {noun} list [all] --json, {noun} show ID --json")


def _print_json(value: Any) -> int:
    from bot.surfaces import json_output

    print(json_output.dumps(value))
    return EXIT_OK


def _follow_window(service: Service, window_id: int) -> int:
    """Drive a window's executions here until it is open with its runbooks done, or ended."""
    from bot import commands
    from bot.execution.engine import Engine
    from bot.schedule import windows
    from bot.surfaces import schedule_text

    engine = Engine(service, report=_report)
    waiting_said = False
    try:
        while True:
            for note in commands.advance_windows(service, window_id):
                print(f"[window {window_id}] {note}", flush=True)
            engine.run_pending(once=True)
            window = commands.get_window(service, window_id)
            if window.state in windows.ENDED or (
                    window.state == windows.OPEN and windows.inside_done(window)):
                break
            if not waiting_said and window.open_execution_id and service.get(
                    window.open_execution_id).state == State.AWAITING_APPROVAL:
                print(f"[window {window_id}] waiting for approval of execution "
                      f"{window.open_execution_id} (runbook approve "
                      f"{window.open_execution_id})", flush=True)
                waiting_said = True
            engine.sleep(service.config.engine.poll_seconds)
    finally:
        engine.close()
    print(schedule_text.window_text(service, window))
    return EXIT_OK if window.state in (windows.OPEN, windows.CLOSED) else EXIT_FAILED


def cmd_completion(args: argparse.Namespace) -> int:
    from bot.surfaces import completion

    if args.shell != "words":
        print(completion.SCRIPTS[args.shell], end="")
        return EXIT_OK
    words = completion.words_of_line(args.line) if args.line is not None else args.words
    completion.answer(_parser(), words, print, os.environ.get("COMP_WORDBREAKS")
                      if args.line is not None else None)
    return EXIT_OK


def cmd_schema(args: argparse.Namespace) -> int:
    from bot.surfaces import schemas

    made = schemas.runbook_schema() if args.kind == "runbook" else schemas.config_schema()
    print(schemas.dumps(made), end="")
    return EXIT_OK


def cmd_docs(args: argparse.Namespace) -> int:
    from bot.config import shipped_runbooks
    from bot.runbooks.catalogue import ACTION_CLASSES
    from bot.runbooks.loading import runbook_files
    from bot.surfaces import action_docs

    print(action_docs.page(ACTION_CLASSES, runbook_files([shipped_runbooks()])), end="")
    return EXIT_OK


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "list": cmd_list,
    "describe": cmd_describe,
    "validate": cmd_validate,
    "plan": cmd_plan,
    "run": cmd_run,
    "approve": lambda a: _decide(a, "approve"),
    "deny": lambda a: _decide(a, "deny"),
    "cancel": lambda a: _decide(a, "cancel"),
    "resume": lambda a: _decide(a, "resume"),
    "confirm": lambda a: _decide(a, "confirm"),
    "status": cmd_status,
    "show": cmd_show,
    "history": cmd_history,
    "audit": audit_commands.cmd_audit,
    "versions": cmd_versions,
    "diff": cmd_diff,
    "engine": cmd_engine,
    "serve": cmd_serve,
    "console": cmd_console,
    "proposals": cmd_proposals,
    "node": cmd_node,
    "chat": cmd_chat,
    "proposal": cmd_proposal,
    "breaker": cmd_breaker,
    "schedule": lambda a: cmd_scheduled(a, "schedule"),
    "window": lambda a: cmd_scheduled(a, "window"),
    "completion": cmd_completion,
    "schema": cmd_schema,
    "docs": cmd_docs,
    "config": setup_commands.cmd_config,
    "db": setup_commands.cmd_db,
}

if __name__ == "__main__":
    sys.exit(main())
