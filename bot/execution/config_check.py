"""``runbook config check``: a configuration judged before anything uses it: the files it
names, its database URL, its runbooks, and each runbook step or check the configured systems
cannot do. A step needing a system the configuration leaves out is *not available here* (the
site does not run that runbook; planning it says what to configure), not an error; a step
whose system is configured but refuses it, or a named file that is missing, is an error.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from adapters.registry import registered
from adapters.slurm import capability
from adapters.slurm.backend import NeedsOperations
from bot.config import Config, database_url_problem, default_database_url
from bot.runbooks.catalogue import KNOWN
from bot.runbooks.loading import LoadedRunbook, RunbookError, load_all
from kit.yamldoc import Loc, dotted

# files that must be there and readable, folders that must be there (None: not set)
FILES = ("secrets.key_file", "slurm.slurm_conf", "slurm.rest.token_file", "slurm.rest.key_file",
         "kubernetes.kubeconfig", "server.alerts_token_file", "server.tls_cert_file",
         "server.tls_key_file", "slack.bot_token_file", "slack.signing_secret_file",
         "slack.app_token_file", "audit.ship.syslog.ca_file", "audit.ship.syslog.cert_file",
         "audit.ship.syslog.key_file", "audit.ship.otlp.headers_file",
         "audit.ship.otlp.ca_file", "audit.ship.otlp.cert_file", "audit.ship.otlp.key_file",
         "etcd.cacert", "etcd.cert", "etcd.key")
FOLDERS = ("slurm.bin_dir", "slurm.rest.job_output_dir", "mariadb.backup_dir",
           "etcd.backup_dir")
PARENTS = ("audit.checkpoint_file",)  # written by the bot: its folder must be there
# what each check kind reads (bot.execution.assembly.CHECK_KINDS builds them): any one of
CHECK_SECTIONS: dict[str, tuple[str, ...]] = {
    "slurm": ("slurm",), "promql": ("prometheus",), "alerts": ("alertmanager",),
    "capacity": ("slurm", "kubernetes"), "command": (), "file": ()}
Ask = Callable[[str], str | None]  # a Slurm operation -> why the backend refuses it


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)  # errors: the check fails
    unavailable: dict[str, list[str]] = field(default_factory=dict)  # runbook -> what it needs
    partial: dict[str, list[str]] = field(default_factory=dict)  # needed by steps under when:
    # Slurm operations only slurmrestd can say it does (offline, unpinned) -> runbooks
    unknown: dict[str, set[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # not wrong, but worth saying
    files: int = 0  # files and folders looked at
    runbooks: int = 0


def check(config: Config, *, ask: Ask | None = None) -> Report:
    """Judge ``config``. ``ask``: the Slurm backend's own answer (a server asked); without
    it the answer comes from the configuration (adapters.slurm.capability)."""
    report = Report()
    _check_files(config, report)
    _check_database(config, report)
    try:
        found = load_all([p for p in config.runbook_paths if p.exists()],  # others: above
                         {n: k[0] for n, k in KNOWN.items()})
    except RunbookError as exc:
        report.problems.extend(exc.problems)
        return report
    report.runbooks = len(found)
    if config.slurm is not None and ask is None:
        slurm = config.slurm
        ask = lambda operation: capability.refusal(slurm, operation)  # noqa: E731
    for _name, loaded in sorted(found.items()):
        _check_runbook(config, loaded, ask, report)
    return report


def _value(config: Config, dotted_path: str) -> Any:
    found: Any = config
    for part in dotted_path.split("."):
        found = getattr(found, part, None)
        if found is None:
            return None
    return found


def _check_files(config: Config, report: Report) -> None:
    def problem(at: str, path: Path, what: str) -> None:
        report.problems.append(f"{at}: {path}: {what}")

    for at in FILES:
        path = _value(config, at)
        if path is not None:
            report.files += 1
            if not Path(path).is_file():
                problem(at, path, "no such file")
            elif not os.access(path, os.R_OK):
                problem(at, path, "not readable by this user")
    for at in FOLDERS:
        path = _value(config, at)
        if path is not None:
            report.files += 1
            if not Path(path).is_dir():
                problem(at, path, "no such folder")
    for at in PARENTS:
        path = _value(config, at)
        if path is not None:
            report.files += 1
            if not Path(path).parent.is_dir():
                problem(at, path, f"its folder {Path(path).parent} does not exist")
    site = "runbooks" in config.model_fields_set  # the site's own paths, by their name
    named = [(f"runbooks.paths[{i}]", p) for i, p in enumerate(config.runbooks.paths)] \
        if site else [(f"runbook_paths[{i}]", p) for i, p in enumerate(config.runbook_paths)]
    for at, path in named:
        report.files += 1
        if not path.exists():
            problem(at, path, "no such file or folder")


def _check_database(config: Config, report: Report) -> None:
    """The URL (RUNBOOK_DB_URL too) and, for SQLite, its folder, which the bot never makes
    (but for its own state folder of the default database, on ``db init``). A database not
    made yet is a note: ``runbook db init`` (or ``serve --init-db``) makes it."""
    url = config.resolved_database_url()
    problem = database_url_problem(url)
    if problem is not None:
        report.problems.append(f"database_url: {problem}")
        return
    scheme, _, rest = url.partition(":///")
    if not scheme.startswith("sqlite") or not rest or rest.startswith(":memory:"):
        return
    path = Path(rest.split("?")[0])
    report.files += 1
    if not path.parent.is_dir() and url != default_database_url():
        report.problems.append(f"database_url: {path.parent}: no such folder (the bot never "
                               "creates a database's folder)")
    elif not path.exists():
        report.notes.append(f"the database {path} is not there yet: `runbook db init` creates "
                            "it" + (" (database.create: any command)" if config.database.create
                                    else ""))


def _check_runbook(config: Config, loaded: LoadedRunbook, ask: Ask | None,
                   report: Report) -> None:
    """A need a step or check always has makes the runbook not available here; one only of
    steps under ``when:`` (a pool's steps: ``node in kubernetes``) makes it available in
    part (the nodes of that pool)."""
    runbook, name = loaded.runbook, loaded.name
    always: list[str] = []
    sometimes: list[str] = []
    found: list[tuple[str, str, str, bool]] = []  # (where, kind, text, conditional)
    for index, step in enumerate(runbook.steps):
        calls: list[tuple[Loc, str, dict[str, Any]]] = [(("steps", index), step.action, step.with_)]
        if step.undo is not None:
            calls.append((("steps", index, "undo"), step.undo.action, step.undo.with_))
        for at, action, args in calls:
            found += [(f"{dotted(at)} ({action})", kind, text, step.when is not None)
                      for kind, text in _action_needs(config, action, args, ask)]
    for section in ("pre_checks", "post_checks"):
        for index, spec in enumerate(getattr(runbook, section)):
            found += [(f"{section}[{index}] ({spec.kind} check)", kind, text,
                       spec.when is not None)
                      for kind, text in _check_needs(config, spec.kind, spec.command)]
    for where, kind, text, conditional in found:
        if kind == "error":
            report.problems.append(f"{loaded.path}: {name}: {where}: {text}")
        elif kind == "note":
            report.unknown.setdefault(text, set()).add(name)
        elif text not in always and text not in sometimes:
            (sometimes if conditional else always).append(text)
    if always:
        report.unavailable[name] = always + [t for t in sometimes if t not in always]
    elif sometimes:
        report.partial[name] = sometimes


def _action_needs(config: Config, action: str, args: Mapping[str, Any],
                  ask: Ask | None) -> Iterable[tuple[str, str]]:
    """("missing", why) for a section or entry not configured, ("error", why) for a
    configured backend that refuses, ("note", why) for what only the server can tell."""
    section = KNOWN.get(action, (None, "?"))[1]
    if section == "always":
        command = args.get("command")
        if action == "host.run" and _literal(command) and command not in config.host_commands:
            yield "missing", f"host_commands.{command}"
        return
    if getattr(config, section, None) is None:
        yield "missing", f"the {section} section"
        return
    cls = _action_classes().get(action)
    if cls is None or not issubclass(cls, NeedsOperations) or ask is None:
        return
    for operation in _operations(cls, args):
        reason = ask(operation)
        if reason == capability.UNKNOWN:
            yield "note", operation
        elif reason is not None:
            yield "error", f"the configured Slurm backend cannot do it: {reason}"


def _check_needs(config: Config, kind: str, command: str | None) -> Iterable[tuple[str, str]]:
    sections = CHECK_SECTIONS[kind]
    if sections and all(getattr(config, s, None) is None for s in sections):
        yield "missing", f"the {' or '.join(sections)} section"
    if kind == "command" and _literal(command) and command not in config.host_commands:
        yield "missing", f"host_commands.{command}"


def _operations(cls: type[NeedsOperations], args: Mapping[str, Any]) -> tuple[str, ...]:
    """The Slurm operations a step asks for: ``operations`` of its literal arguments (a
    template's value is not known before a request), else everything the action may need."""
    literal = {key: value for key, value in args.items() if _literal(value)}
    try:
        return tuple(cls.operations(cls.__new__(cls), SimpleNamespace(**literal)))
    except Exception:  # it reads an argument only a request gives
        return cls.needs


def _literal(value: object) -> bool:
    return isinstance(value, str | int | float | bool) and "{{" not in str(value)


def _action_classes() -> dict[str, type[Any]]:
    return {cls.name: cls for adapter in registered() for cls in adapter.action_classes}


def servers(config: Config) -> tuple[Ask | None, list[str]]:
    """Without --offline: the configured adapters built as ``runbook serve`` builds them; the
    Slurm backend's own answer to what it can do, and a problem for each of Slurm and
    Kubernetes that does not list its nodes."""
    from adapters.slurm.backend import unsupported

    backends: dict[str, Any] = {}
    problems: list[str] = []
    for adapter in registered():
        section = getattr(config, adapter.section, None)
        if section is not None:
            try:
                built = adapter.build(section, backends)
            except Exception as exc:  # a client that cannot be set up: say which
                problems.append(f"{adapter.section}: cannot be set up: {exc}")
                continue
            if built.backend is not None:
                backends[adapter.name] = built.backend
    reads: dict[str, Callable[[Any], object]] = {
        "slurm": lambda b: b.nodes(None, with_jobs=False),
        "kubernetes": lambda b: b.list_nodes(config.inventory.kubernetes_selector)}
    for name, read in reads.items():
        if name in backends:
            try:
                read(backends[name])
            except Exception as exc:  # any client's error: the server did not answer
                problems.append(f"{name}: does not answer: {exc}")
    slurm = backends.get("slurm")
    ask: Ask | None = None
    if slurm is not None:
        ask = lambda operation: _asked(unsupported, slurm, operation)  # noqa: E731
    return ask, problems


def _asked(unsupported: Callable[[Any, str], str | None], backend: Any,
           operation: str) -> str | None:
    try:
        return unsupported(backend, operation)
    except Exception as exc:  # the server would not say: then it cannot be used either
        return f"slurmrestd did not say ({exc})"
