"""upgrade-slurm's actions: the version window, slurmdbd and slurmctld (install, then wait
until ready), the state save copy, and slurmd in batches with jobs left running.

Installs are the site's ``slurm.upgrade.commands``, run on the bot host as argument lists.
Nothing is rolled back: a failed stage stops the upgrade and says what was done.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from adapters.actions import ActionBase, ActionContext, ActionError, ActionResult, Seconds
from adapters.actions import StrictArguments as Args
from adapters.host import HostCommand, allowed_argv, run_command
from adapters.slurm.backend import SlurmBackend, SlurmError
from adapters.slurm.config import SlurmConfig
from adapters.slurm.daemons import CliDaemonReads, DaemonReads, NodeDaemon
from adapters.slurm.versions import parse_version, supported_span, window_problems
from kit import hostlist
from kit.durations import format_duration

Install = Callable[[HostCommand, list[str], float], "subprocess.CompletedProcess[str]"]
STAGES = ("the version window check", "the accounting database backup", "slurmdbd",
          "the state save copy", "slurmctld", "slurmd")
VERSION = r"^\d{2}\.\d{2}\.\d+$"


def _hosts(names: list[str]) -> str:
    return hostlist.compress(names) if names else "none"


def nodes_of(value: str | list[str]) -> list[str]:
    return hostlist.expand(value) if isinstance(value, str) else list(dict.fromkeys(value))


def stage_error(stage: str, detail: str, back: GoBack | None = None) -> ActionError:
    """A failed stage, what the stages before it did and what did not start, and how to go
    back to the old release from what the run saved (``back``)."""
    at = STAGES.index(stage)
    done = ", ".join(STAGES[1:at]) or "nothing"
    return ActionError(f"{stage} failed: {detail}. Done before it: {done}; not started: "
                       f"{', '.join(STAGES[at + 1:]) or 'nothing'}. Nothing is rolled back "
                       "(Slurm does not downgrade): fix the cause and run upgrade-slurm again"
                       + (back.text(at) if back is not None else ""))


class GoBack(Args):
    """Where the run saved what going back needs: the accounting database's dump and the
    copy of slurmctld's StateSaveLocation (upgrade-slurm's backup= and state_copy=)."""

    backup: str = Field(default="", pattern=r"^$|^/[A-Za-z0-9._/-]+$", max_length=300)
    state_copy: str = Field(default="", pattern=r"^$|^/[A-Za-z0-9._/-]+$", max_length=300)

    def text(self, at: int) -> str:
        if not self.backup or at < STAGES.index("slurmdbd"):
            return ""
        said = (f". To go back instead: reinstall the old release's slurmdbd and restore the "
                f"accounting database from {self.backup} (runbook run restore-slurmdbd "
                f"backup={self.backup})")
        if self.state_copy and at > STAGES.index("the state save copy"):
            said += (f", then the old slurmctld with its StateSaveLocation from "
                     f"{self.state_copy} (and the old slurmd where a node was upgraded)")
        return said


class _UpgradeBase(ActionBase[SlurmBackend, SlurmConfig]):
    """Reads through ``DaemonReads``, installs through ``install`` (tests hand in fakes)."""

    def __init__(self, backend: SlurmBackend, config: SlurmConfig,
                 sleep: Callable[[float], None] = time.sleep, reads: DaemonReads | None = None,
                 install: Install | None = None) -> None:
        super().__init__(backend, config, sleep)
        self._given_reads = reads
        self._install: Install = install or run_command

    @property
    def reads(self) -> DaemonReads:
        if self._given_reads is None:  # built at first use: planning needs no Slurm
            self._given_reads = CliDaemonReads(self.config)
        return self._given_reads

    def _command(self, name: str, extra: list[str]) -> tuple[HostCommand, list[str]]:
        return allowed_argv(self.config.upgrade.commands, name, extra, "upgrade command",
                            "slurm.upgrade.commands")

    def _shown(self, name: str, extra: list[str]) -> str:
        return f"run on the bot host: {shlex.join(self._command(name, extra)[1])}"

    def _run_install(self, name: str, extra: list[str], deadline: float) -> str:
        command, argv = self._command(name, extra)
        timeout = max(1.0, min(command.timeout, deadline - time.monotonic()))
        done = self._install(command, argv, timeout)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise ActionError(f"{shlex.join(argv)} exited {done.returncode}: "
                              + (" | ".join(tail) or "no output"))
        return done.stdout.strip()

    def _wait(self, ctx: ActionContext, ready: Callable[[], str | None], deadline: float,
              what: str, poll: float) -> None:
        """Until ``ready()`` returns None (else it says what is missing), or the deadline."""
        while (missing := ready()) is not None:
            if time.monotonic() >= deadline:
                raise ActionError(f"timed out waiting for {what}: {missing}")
            ctx.checkpoint(f"waiting for {what}")
            self._sleep(ctx.pause(poll))


class CheckArguments(Args):
    version: str = Field(pattern=VERSION)
    nodes: str | list[str]
    canary: str = ""


class UpgradeCheckAction(_UpgradeBase):
    """``slurm.upgrade_check``: reads every daemon's version and refuses, changing nothing,
    an upgrade that would leave slurmdbd >= slurmctld >= slurmd or the release span broken
    at any stage; also that the install commands are configured and the nodes known."""

    name: ClassVar[str] = "slurm.upgrade_check"
    Arguments: ClassVar[type[Args]] = CheckArguments

    def plan(self, args: CheckArguments) -> list[str]:
        rule = self.config.upgrade.max_releases_apart
        span = f"at most {rule}" if rule else "Slurm's rule: at most 2 releases, 3 from 24.11"
        return ["read versions: scontrol show config (SLURM_VERSION), sacctmgr show "
                "configuration (SLURMDBD_VERSION), scontrol show node (Version)",
                f"refuse unless {args.version} >= every daemon and slurmdbd >= slurmctld >= "
                f"slurmd after each stage ({span}); changes nothing",
                self._window_now(args)]

    def _window_now(self, args: CheckArguments) -> str:
        """The window as the cluster stands while planning: an upgrade it forbids is refused
        before any approval; versions that cannot be read now are left to the step."""
        try:
            found = self._check(args)
        except SlurmError as exc:  # Slurm not answering: the step reads again, changing nothing
            return f"now: versions not readable ({exc}); the step reads them before any change"
        except ActionError as exc:
            raise ActionError(f"the version window refuses this upgrade: {exc}") from exc
        return f"now: {found.summary}"

    def run(self, args: CheckArguments, ctx: ActionContext) -> ActionResult:
        try:
            return self._check(args)
        except (ActionError, ValueError) as exc:
            if str(exc).startswith(STAGES[0]):
                raise
            raise stage_error(STAGES[0], str(exc)) from exc

    def _check(self, args: CheckArguments) -> ActionResult:
        for name, extra in (("slurmdbd-install", [args.version]),
                            ("slurmctld-install", [args.version]),
                            ("slurmd-install", [args.version, "NODE"])):
            self._command(name, extra)
        target = parse_version(args.version)
        nodes, canary = nodes_of(args.nodes), nodes_of(args.canary) if args.canary else []
        daemons = {d.name: d for d in self.reads.node_daemons(None)}
        unknown = [n for n in [*nodes, *canary] if n not in daemons]
        if unknown or not set(canary) <= set(nodes):
            raise ActionError(f"unknown to Slurm: {hostlist.compress(unknown)}" if unknown
                              else "the canary must be among the nodes")
        silent = [n for n in nodes if not daemons[n].version or not daemons[n].responding]
        if silent:
            raise ActionError(f"slurmd on {hostlist.compress(silent)} does not answer (or "
                              "reports no version): bring it back, or leave it out of nodes")
        dbd = parse_version(self.reads.dbd_version())
        ctld = parse_version(self.reads.controller().get("SLURM_VERSION", ""))
        slurmd = {n: parse_version(d.version) for n, d in daemons.items() if d.version}
        problems = window_problems(target, dbd, ctld, slurmd, set(nodes),
                                   self.config.upgrade.max_releases_apart)
        if problems:
            raise ActionError("; ".join(problems))
        seen = sorted({str(v) for v in slurmd.values()})
        span = supported_span(target, self.config.upgrade.max_releases_apart)
        return ActionResult(
            summary=f"window ok: slurmdbd {dbd}, slurmctld {ctld}, slurmd {', '.join(seen)} "
                    f"-> {target} (at most {span} releases apart); {len(nodes)} node(s) to "
                    "upgrade",
            details={"slurmdbd": str(dbd), "slurmctld": str(ctld),
                     "slurmd": {n: str(v) for n, v in slurmd.items()}, "target": str(target)},
            changed=False)


class DaemonArguments(GoBack):
    daemon: Literal["slurmdbd", "slurmctld"]
    version: str = Field(pattern=VERSION)
    timeout: Seconds = 600.0  # until the daemon is ready after its install
    poll: Seconds = Field(default=1.0, le=60)


class DaemonUpgradeAction(_UpgradeBase):
    """``slurm.upgrade_daemon``: the site's ``DAEMON-install VERSION``, then wait until the
    daemon answers at VERSION. slurmdbd: accounts listed and slurmctld's agent queue to it
    empty (sdiag). slurmctld: every node that answered before answers again."""

    name: ClassVar[str] = "slurm.upgrade_daemon"
    # an install cut short by a crash is not re-run blindly: a person decides
    idempotent: ClassVar[bool] = False
    Arguments: ClassVar[type[Args]] = DaemonArguments

    def plan(self, args: DaemonArguments) -> list[str]:
        within = f"at most {format_duration(args.timeout)}"
        if args.daemon == "slurmdbd":
            wait = ("wait until sacctmgr show configuration says SLURMDBD_VERSION="
                    f"{args.version}, sacctmgr lists the accounts and sdiag's DBD Agent queue "
                    f"size is 0 ({within})")
        else:
            wait = (f"wait until scontrol show config says SLURM_VERSION={args.version} and "
                    f"every node that answered before answers again (scontrol show node; "
                    f"{within})")
        return [self._shown(f"{args.daemon}-install", [args.version]), wait]

    def run(self, args: DaemonArguments, ctx: ActionContext) -> ActionResult:
        stage = args.daemon
        deadline = min(ctx.deadline, time.monotonic() + args.timeout)
        try:
            before = {d.name for d in self.reads.node_daemons(None) if d.responding}
        except ActionError as exc:
            raise stage_error(stage, f"could not read the nodes first: {exc}", args) from exc
        ctx.checkpoint(f"starting the {stage} install")
        ctx.progress(f"{stage}: installing {args.version}")
        try:
            said = self._run_install(f"{stage}-install", [args.version], ctx.deadline)
            ready = (lambda: self._dbd_missing(args.version)) if stage == "slurmdbd" else (
                lambda: self._ctld_missing(args.version, before))
            self._wait(ctx, ready, deadline, f"{stage} {args.version}", args.poll)
        except ActionError as exc:
            if ctx.stopping():
                raise
            raise stage_error(stage, str(exc), args) from exc
        return ActionResult(summary=f"{stage} runs {args.version}" + (
            f"; {len(before)} node(s) registered again" if stage == "slurmctld" else ""),
            details={"daemon": stage, "version": args.version, "install_output": said[-2000:],
                     "nodes": sorted(before)})

    def _dbd_missing(self, version: str) -> str | None:
        try:
            seen = self.reads.dbd_version()
            if seen != version:
                return f"slurmdbd says {seen}"
            self.backend.accounts()
            queue = self.backend.dbd_queue()
        except ActionError as exc:
            return str(exc)
        return None if queue == 0 else f"DBD Agent queue size {queue}"

    def _ctld_missing(self, version: str, before: set[str]) -> str | None:
        try:
            seen = self.reads.controller().get("SLURM_VERSION", "")
            if seen != version:
                return f"slurmctld says {seen or 'no version'}"
            daemons = self.reads.node_daemons(sorted(before))
        except ActionError as exc:
            return str(exc)
        answering = {d.name for d in daemons if d.responding and d.version}
        missing = sorted(before - answering)
        return f"not registered yet: {hostlist.compress(missing)}" if missing else None


class CopyArguments(Args):
    path: str = Field(pattern=r"^/[A-Za-z0-9._/-]+$", max_length=300)


class StateSaveCopyAction(_UpgradeBase):
    """``slurm.state_save_copy``: slurmctld's StateSaveLocation (scontrol show config) copied
    to PATH, which must not be inside it; the bot host must see the directory (shared
    storage, as a backup slurmctld needs, or the bot on the controller)."""

    name: ClassVar[str] = "slurm.state_save_copy"
    Arguments: ClassVar[type[Args]] = CopyArguments

    def plan(self, args: CopyArguments) -> list[str]:
        return [f"cp -a <StateSaveLocation of scontrol show config> {args.path} (through "
                f"{args.path}.partial; a copy already there is replaced)"]

    def run(self, args: CopyArguments, ctx: ActionContext) -> ActionResult:
        stage = "the state save copy"
        try:
            source = Path(self.reads.controller().get("StateSaveLocation", ""))
        except ActionError as exc:
            raise stage_error(stage, f"scontrol show config: {exc}") from exc
        target = Path(args.path)
        if not source.is_absolute() or not source.is_dir():
            raise stage_error(stage, f"StateSaveLocation {source} is not a directory the bot "
                              "host sees (mount it, or run the bot on the controller)")
        if target.resolve().is_relative_to(source.resolve()):
            raise stage_error(stage, f"{target} is inside StateSaveLocation {source}")
        partial = target.with_name(target.name + ".partial")
        try:
            shutil.rmtree(partial, ignore_errors=True)
            shutil.copytree(source, partial, symlinks=True)
            if target.exists():
                shutil.rmtree(target)
            partial.replace(target)
        except OSError as exc:
            raise stage_error(stage, f"copying {source} to {target}: {exc}") from exc
        files = [p for p in target.rglob("*") if p.is_file()]
        size = sum(p.stat().st_size for p in files)
        return ActionResult(summary=f"copied {source} to {target} ({len(files)} files, "
                                    f"{size} bytes)",
                            details={"source": str(source), "path": str(target),
                                     "files": len(files), "bytes": size})


class SlurmdArguments(GoBack):
    version: str = Field(pattern=VERSION)
    nodes: str | list[str]
    canary: str = ""
    max_parallel: int = Field(default=1, ge=1, le=64)
    node_timeout: Seconds = 600.0  # per batch: the installs, then until the nodes answer
    poll: Seconds = Field(default=1.0, le=60)


def batches(nodes: list[str], canary: list[str], size: int) -> list[list[str]]:
    """The canaries alone first, then the other nodes ``size`` at a time, in order."""
    rest = [n for n in nodes if n not in canary]
    return ([canary] if canary else []) + [rest[i:i + size] for i in range(0, len(rest), size)]


class SlurmdUpgradeAction(_UpgradeBase):
    """``slurm.upgrade_slurmd``: batch by batch (the canaries alone first), the site's
    ``slurmd-install VERSION NODE`` for each node of the batch, then wait until each answers
    at VERSION with a new SlurmdStartTime. No drain: running jobs keep running (slurmstepd
    outlives slurmd). A batch with a failure ends the step; no later batch starts."""

    name: ClassVar[str] = "slurm.upgrade_slurmd"
    idempotent: ClassVar[bool] = False
    Arguments: ClassVar[type[Args]] = SlurmdArguments

    def plan(self, args: SlurmdArguments) -> list[str]:
        nodes, canary = nodes_of(args.nodes), nodes_of(args.canary) if args.canary else []
        groups = batches(nodes, canary, args.max_parallel)
        lines = [f"{len(nodes)} node(s) in {len(groups)} batch(es), jobs left running (no "
                 "drain); stop at the first failure; each batch within "
                 f"{format_duration(args.node_timeout)}"]
        for number, group in enumerate(groups, 1):
            label = "canary" if canary and number == 1 else f"batch {number}"
            runs = "; ".join(shlex.join(self._command("slurmd-install",
                                                      [args.version, n])[1]) for n in group)
            lines.append(f"{label} {hostlist.compress(group)}: run on the bot host: {runs}; "
                         f"wait until each answers with Version={args.version} and a new "
                         "SlurmdStartTime")
        return lines

    def run(self, args: SlurmdArguments, ctx: ActionContext) -> ActionResult:
        nodes, canary = nodes_of(args.nodes), nodes_of(args.canary) if args.canary else []
        self._command("slurmd-install", [args.version, "NODE"])
        done: list[str] = []
        for group in batches(nodes, canary, args.max_parallel):
            started: list[str] = []
            try:
                ctx.checkpoint(f"before slurmd on {hostlist.compress(group)}")
                started = group
                self._batch(args, ctx, group)
            except ActionError as exc:
                left = [n for n in nodes if n not in done and n not in started]
                where = (f"{exc}; upgraded: {_hosts(done)}; not started: "
                         f"{_hosts(left)}")
                if started:
                    where = f"slurmd on {hostlist.compress(started)}: {where}"
                if ctx.stopping():
                    exc.args = (where,)
                    raise
                raise stage_error("slurmd", where, args) from exc
            done += group
            ctx.progress(f"slurmd {args.version} on {hostlist.compress(group)} ({len(done)} "
                         f"of {len(nodes)})")
        return ActionResult(summary=f"slurmd {args.version} on {len(done)} node(s)",
                            details={"nodes": done, "version": args.version,
                                     "canary": canary})

    def _batch(self, args: SlurmdArguments, ctx: ActionContext, group: list[str]) -> None:
        deadline = min(ctx.deadline, time.monotonic() + args.node_timeout)
        before = {d.name: d for d in self.reads.node_daemons(group)}
        ctx.checkpoint(f"installing slurmd on {hostlist.compress(group)}")
        with ThreadPoolExecutor(len(group), thread_name_prefix="slurmd-install") as pool:
            futures = {node: pool.submit(self._run_install, "slurmd-install",
                                         [args.version, node], deadline) for node in group}
        failed = []
        for node, future in futures.items():
            error = future.exception()
            if error is not None:
                if not isinstance(error, ActionError):
                    raise error
                failed.append(f"{node}: {error}")
        if failed:  # the others of the batch were installed: their waits are skipped
            raise ActionError("; ".join(failed))
        self._wait(ctx, lambda: self._missing(args.version, group, before), deadline,
                   f"slurmd {args.version} on {hostlist.compress(group)}", args.poll)

    def _missing(self, version: str, group: list[str],
                 before: dict[str, NodeDaemon]) -> str | None:
        try:
            now = {d.name: d for d in self.reads.node_daemons(group)}
        except ActionError as exc:
            return str(exc)
        waiting = []
        for node in group:
            seen, old = now.get(node), before.get(node)
            if seen is None or not seen.responding or seen.version != version or (
                    old is not None and seen.started == old.started):
                waiting.append(f"{node} ({_described(seen, old)})")
        return ", ".join(waiting) or None


def _described(seen: NodeDaemon | None, old: NodeDaemon | None) -> str:
    if seen is None:
        return "unknown to Slurm"
    if not seen.responding:
        return "not responding"
    if old is not None and seen.started == old.started:
        return f"slurmd not restarted, started {seen.started}"
    return f"Version={seen.version or 'none'}"


UPGRADE_ACTIONS = (UpgradeCheckAction, DaemonUpgradeAction, StateSaveCopyAction,
                   SlurmdUpgradeAction)
