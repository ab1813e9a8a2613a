"""The command service (``Service``): the one path every request takes, whoever asks and
from where.

It decides and records, and runs nothing (running the steps is bot.execution.engine's job);
it never imports a surface, bot.schedule or bot.alerts, which all call it.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine
from sqlalchemy import select as sa_select
from sqlalchemy.exc import IntegrityError

from bot.config import CHANGE, Config
from bot.execution import (
    confirming,
    executions,
    fault_holds,
    locking,
    node_states,
    remediations,
)
from bot.execution.approval import approval_problem, may_steer, unapprovable
from bot.execution.checks.core import Checks
from bot.execution.executions import Execution
from bot.execution.planning import (
    Plan,
    PlanError,
    make_plan,
    runbook_nodes,
    with_break_glass,
    with_outside_window,
)
from bot.runbooks import checked, params, secrets, versions
from bot.runbooks.catalogue import Catalogue
from bot.runbooks.checked import Checked
from bot.runbooks.inventory import LiveInventory
from bot.runbooks.loading import LaterArguments, LoadedRunbook, RunbookError, load_all, load_text
from bot.runbooks.model import Runbook
from bot.store import audit, db
from bot.store.schema import approvals, maintenance_windows, runbook_versions
from bot.store.words import NOT_STARTED, Kind, State
from kit import hostlist, secretbox
from kit.errors import Refused
from kit.secretbox import SecretBox, SecretKeyProblem


@dataclass(frozen=True)
class Preapproval:
    """Approvals collected ahead of a run (on a schedule or a maintenance window), bound to
    the hash of the plan the approvers saw. They count only when planning now gives that
    same hash, and only for approvers the runbook's policy accepts (self-approval rules
    included); otherwise the run waits for approval like any request."""

    plan_hash: str
    approvers: tuple[str, ...]
    subject: str  # where they were collected: "schedule 3", "window 2"


# Service.from_config's inventory until the first read lists the pools.
NOT_LISTED_YET = params.Inventory()
# Service.from_config's assembled parts until their first read (Service._assembled).
_LATER: Any = object()
_ASSEMBLED = ("catalogue", "checks", "warnings", "backends", "live_inventory")
_ASSEMBLING = threading.Lock()


def _seen_hash(plan_hash: str | None) -> str | None:
    """The plan hash an approver names, checked: 6 to 64 hexadecimal characters."""
    if plan_hash is None:
        return None
    seen = plan_hash.strip().lower().removeprefix("plan=")
    if not re.fullmatch(r"[0-9a-f]{6,64}", seen):
        raise Refused(f"{plan_hash[:80]!r} is not a plan hash: give the first 6 or more "
                      "characters of the plan hash the request shows")
    return seen


@dataclass
class Service:
    """The command service: the one path every request and decision takes, whoever asks
    and from where. A surface builds it with ``from_config`` and calls its methods
    (request, approve, deny, cancel, resume, confirm, get, timeline), as schedules, windows
    and alerts do; the engine takes it as its ``Parts`` (``replan`` plans an execution again).

    It owns the database handle ``db``, the catalogue, the checks, the inventory and the
    loaded runbooks (every version recorded, so ``pinned`` loads an execution's own). It
    validates, plans, checks permissions, takes locks and records every decision in the
    audit log in the transaction of the change (decisions are compare-and-sets on the
    execution row). It runs nothing (that is the engine's job) and imports no surface.
    Errors a person can fix are ``Refused`` (exit code 2 on the command line): nothing was
    done, and a refused run request still leaves one audit event saying who asked for
    what and why it was refused.
    """

    config: Config
    db: Engine
    catalogue: Catalogue
    checks: Checks
    inventory: params.Inventory
    warnings: list[str] = field(default_factory=list)  # e.g. a pool that could not be listed
    backends: dict[str, Any] = field(default_factory=dict)  # for read-only views (node view)
    # lists the pools again when older than inventory.refresh_seconds (from_config sets it;
    # a factory, not a class default, so that a read before assembly reaches __getattr__)
    live_inventory: LiveInventory | None = field(default_factory=lambda: None)
    _runbooks: dict[str, LoadedRunbook] | None = None
    _pinned: dict[tuple[str, str, str], LoadedRunbook] = field(default_factory=dict)
    _box: SecretBox | None = None
    _box_read: bool = False

    # from_config: the adapters, built when a command first needs the catalogue, the
    # checks, the backends or the inventory (status, history, approve... never do)
    _assemble: Callable[[], Any] | None = None
    _checked: Checked | None = None  # the runbook files that passed before (from_config)

    @classmethod
    def from_config(cls, config: Config,
                    on_problems: Callable[[list[str]], None] | None = None) -> Service:
        """The service of a configuration; ``on_problems`` hears why a pool could not be
        listed, each time the pools are listed."""
        handle = db.connect(config.resolved_database_url(), create=config.database.create)

        def assemble() -> Any:
            from bot.execution.assembly import assemble

            parts = assemble(config, handle)
            if on_problems is not None:
                parts.live.on_problems = on_problems
            return parts

        return cls(config=config, db=handle, catalogue=_LATER, checks=_LATER,
                   inventory=NOT_LISTED_YET, _assemble=assemble,
                   _checked=Checked.read(checked.beside(config.resolved_database_url())))

    def __post_init__(self) -> None:
        if self._assemble is not None:
            for name in _ASSEMBLED:  # the first read assembles them (__getattr__)
                self.__dict__.pop(name, None)
        if self.inventory is NOT_LISTED_YET:
            if self._assemble is None and self.live_inventory is None:
                raise ValueError("an inventory listed at first use needs live_inventory")
            del self.inventory  # the first read lists the pools (__getattr__)

    if not TYPE_CHECKING:  # hidden from mypy, which would allow any attribute otherwise
        def __getattr__(self, name: str) -> Any:
            """Only ever the assembled parts before their first use, or ``inventory`` before
            its first listing: commands that never read them (status, approve, cancel...)
            never build an adapter nor wait on Slurm or Kubernetes."""
            if name in _ASSEMBLED and self.__dict__.get("_assemble") is not None:
                self._assembled()
                return self.__dict__[name]
            if name != "inventory" or (self.__dict__.get("live_inventory") is None
                                       and self.__dict__.get("_assemble") is None):
                raise AttributeError(f"{type(self).__name__!r} has no attribute {name!r}")
            return self.refresh_inventory()

    def _assembled(self) -> None:
        """Build the adapters (bot.execution.assembly): the catalogue, checks, backends;
        once, whichever thread reads first."""
        with _ASSEMBLING:
            if self._assemble is None:
                return
            parts = self._assemble()
            self._assemble = None
        built = {"catalogue": parts.catalogue, "checks": parts.checks,
                 "warnings": parts.warnings, "backends": parts.backends,
                 "live_inventory": parts.live}
        for name, value in built.items():  # a part set before (a test's own) is kept
            self.__dict__.setdefault(name, value)

    # --- runbooks -----------------------------------------------------------------

    def runbooks(self, actor: str = "bot") -> dict[str, LoadedRunbook]:
        """Every runbook, validated, with its version recorded (or refused on a conflict)."""
        if self._runbooks is None:
            found = load_all(self.config.runbook_paths,
                             LaterArguments(lambda: self.catalogue.arguments()),
                             checked=self._checked)
            with self.db.begin() as conn:
                problems = []
                for loaded in found.values():
                    try:
                        versions.record(conn, loaded, actor)
                    except versions.VersionConflict as exc:
                        problems.append(str(exc))
                if problems:
                    raise RunbookError(problems)
            self._runbooks = found
        return self._runbooks

    def runbook(self, name: str) -> LoadedRunbook:
        found = self.runbooks()
        if name not in found:
            hint = difflib.get_close_matches(name, sorted(found), n=1)
            suggestion = f' (did you mean "{hint[0]}"?)' if hint else ""
            raise Refused(
                f'no runbook "{name[:64]}"{suggestion}; known: {", ".join(sorted(found))}'
            )
        return found[name]

    def known(self, name: str) -> Runbook | None:
        """The runbook of that name, if it loads (to keep a refused request's secrets out
        of the audit log)."""
        try:
            loaded = self.runbooks().get(name)
        except RunbookError:
            return None
        return loaded.runbook if loaded is not None else None

    def pinned(self, name: str, version: str, content_hash: str) -> LoadedRunbook:
        """The runbook version an execution was requested with, from the text the database
        keeps of every version (the file may have moved on since)."""
        current = self.runbooks().get(name)
        if current is not None and (current.runbook.version, current.content_hash) == (
                version, content_hash):
            return current
        key = (name, version, content_hash)
        if key not in self._pinned:
            with self.db.connect() as conn:
                source = conn.execute(sa_select(runbook_versions.c.source).where(
                    runbook_versions.c.name == name, runbook_versions.c.version == version,
                    runbook_versions.c.content_hash == content_hash)).scalar()
            if source is None:
                raise Refused(f"{name} {version} (content {content_hash[:12]}…) is not in the "
                              "database's record of runbook versions: request it again")
            try:
                loaded = load_text(source, Path(f"{name}-{version}.yaml"),
                                   self.catalogue.arguments())
            except RunbookError as exc:
                raise Refused(f"{name} {version} no longer loads: {exc}") from exc
            if loaded.content_hash != content_hash:
                raise Refused(f"{name} {version}: the recorded text does not match its content "
                              "hash")
            self._pinned[key] = loaded
        return self._pinned[key]

    def node_states(self, nodes: Sequence[str], execution_id: int) -> str:
        """As a run fails or is cancelled: a node its failed check keeps out of Slurm is kept
        cordoned in Kubernetes too; then where each node stands now in each pool."""
        kept = fault_holds.carry_over(self.backends, self.inventory, nodes, execution_id)
        where = node_states.describe(self.backends, self.inventory, nodes)
        return f"{kept}. {where}" if kept and where else kept or where

    def replan(self, ex: Execution) -> Plan:
        """Plan an execution again: its pinned runbook version, its parameters (its secrets
        decrypted, so their fingerprints are checked again), today's facts (inventory,
        capacity, windows, what the bot did before)."""
        loaded = self.pinned(ex.runbook, ex.version, ex.content_hash)
        given = {k: _text(v) for k, v in ex.params.items() if v is not None}
        given.update(self.unsealer(ex).clear())
        if ex.plan.change is not None:  # the reference it was requested (and approved) with
            given[CHANGE] = ex.plan.change
        return self.plan(ex.runbook, given, break_glass=ex.plan.break_glass, loaded=loaded)

    # --- planning and requests ------------------------------------------------------

    def plan(self, name: str, raw: Mapping[str, str], *, break_glass: bool = False,
             window: frozenset[str] | None = None, loaded: LoadedRunbook | None = None) -> Plan:
        """``window``: plan as if a maintenance window over these nodes were open (a
        window plans the runbooks it will run inside itself). ``loaded``: plan this
        version of the runbook rather than the current file (an execution's pinned one).
        ``change=REF`` in ``raw`` is the request's change reference, not a parameter."""
        loaded = loaded or self.runbook(name)
        raw = dict(raw)
        change = str(raw.pop(CHANGE, "")).strip() or None
        problem = self.config.policy.change_problem(loaded.runbook.risk, change)
        if problem is not None:  # before anything is planned, as a bad parameter is
            raise Refused(f"{name}: {problem}")
        self.refresh_inventory()
        try:
            values = params.validate(loaded.runbook, raw, self.inventory)
            weakened = params.weakened_guards(loaded.runbook, values, self.inventory)
            values, sealed = secrets.seal_values(loaded.runbook, values, self.secret_box())
            plan = make_plan(loaded, values, self.inventory, self.catalogue, self.config,
                             self._audit_facts(loaded), change)
        except (params.ParamError, PlanError, SecretKeyProblem) as exc:
            raise Refused(f"{name}: {exc}") from exc
        plan = dataclasses.replace(plan, sealed=sealed)
        self._check_follow_up(name, plan)
        plan = self._guard_window(loaded, plan, window)
        plan = self._guard_capacity(name, plan, break_glass, weakened)
        return self._warn_repeat(loaded, plan)

    def secret_box(self) -> SecretBox | None:
        """The site key for secret parameters (None: none configured); read once."""
        if not self._box_read:
            self._box = secretbox.load(self.config.secrets.key_file)
            self._box_read = True
        return self._box

    def unsealer(self, ex: Execution) -> secrets.Unsealer:
        """The execution's secret parameters, decrypted for the engine (an empty Unsealer
        without a read when it has none); Refused when they cannot be: no key, another
        key, a stored value gone."""
        if not secrets.has_placeholder(ex.params):
            return secrets.Unsealer()
        with self.db.connect() as conn:
            sealed = executions.sealed_secrets(conn, ex.id)
        try:
            return secrets.Unsealer.open(ex.params, sealed, self.secret_box())
        except SecretKeyProblem as exc:
            raise Refused(f"execution {ex.id}: its secret parameters cannot be read: {exc}") \
                from exc

    def refresh_inventory(self) -> params.Inventory:
        """The inventory as of at most ``inventory.refresh_seconds`` ago: every plan (a
        request, an alert's proposal, the engine's plan before it starts) sees the pools a
        node serves now, not when this process started."""
        if self.live_inventory is not None:
            self.inventory = self.live_inventory.current()
        return self.inventory

    def _check_follow_up(self, name: str, plan: Plan) -> None:
        """The proposal a failure would leave must be one that can be requested: its
        runbook exists and its parameters are valid now (they are checked again on Run)."""
        follow = plan.propose_on_failure
        if not follow:
            return
        target = self.runbook(follow["runbook"])
        try:
            params.validate(target.runbook, follow["params"], self.inventory)
        except params.ParamError as exc:
            raise Refused(f"{name}: propose_on_failure ({follow['runbook']}): {exc}") from exc

    # --- what the bot did to nodes before --------------------------------------------

    def remediation_kinds(self) -> dict[str, str]:
        """Runbook name -> its ``remediation`` (drain, repair, resume), for those that say."""
        return {name: loaded.runbook.remediation for name, loaded in self.runbooks().items()
                if loaded.runbook.remediation}

    def repeat_offences(self, node: str) -> list[tuple[int, str]]:
        """The remediations (drain or repair runbooks that ran) ``node`` needed within
        ``remediation.repeat.days``, when there are at least ``remediations`` of them (a
        repeat offender); else []."""
        repeat = self.config.remediation.repeat
        counted = [n for n, kind in self.remediation_kinds().items() if kind != "resume"]
        since = remediations.iso_ago(repeat.days * 86400)
        with self.db.connect() as conn:
            found = remediations.of_node(conn, node, counted, since)
        return found if len(found) >= repeat.remediations else []

    def _warn_repeat(self, loaded: LoadedRunbook, plan: Plan) -> Plan:
        """A runbook that returns nodes to service warns, in its plan, about a node that is a
        repeat offender: it may need a new GPU rather than another resume."""
        if loaded.runbook.remediation != "resume":
            return plan
        warnings = []
        for node in sorted(runbook_nodes(loaded, plan.params)):
            found = self.repeat_offences(node)
            if found:
                warnings.append(repeat_text(node, found, self.config.remediation.repeat.days)
                                + "; consider swap-gpu instead")
        return dataclasses.replace(plan, warnings=warnings) if warnings else plan

    def _guard_window(self, loaded: LoadedRunbook, plan: Plan,
                      window: frozenset[str] | None) -> Plan:
        """``windows: required``: outside an open window over its nodes, one more approval."""
        if loaded.runbook.windows != "required":
            return plan
        nodes = runbook_nodes(loaded, plan.params)
        if window is not None and nodes <= window:
            return plan
        with self.db.connect() as conn:
            rows = conn.execute(sa_select(maintenance_windows.c.nodes)
                                .where(maintenance_windows.c.state == "open")).scalars().all()
        if rows and nodes <= {n for hosts in rows for n in hostlist.expand(hosts)}:
            return plan
        return with_outside_window(plan)

    def _guard_capacity(self, name: str, plan: Plan, break_glass: bool,
                        weakened: Sequence[params.WeakenedGuard] = ()) -> Plan:
        """Break-glass guards. Refuse a plan that would take the pool under its GPU floor,
        or whose parameters weaken a guard the runbook marks (``weakens_guard``), unless the
        requester asked for break-glass: then one more approval. A pool under the site floor
        (``guards.min_free_gpus``) is refused whatever was asked."""
        short = [(check, self.checks.evaluate(check)) for check in plan.pre_checks
                 if check.kind == "capacity" and not check.skipped]
        under_site = [f"{check.name}: {outcome.detail}" for check, outcome in short
                      if not outcome.passed and outcome.extra.get("below_site_floor")]
        if under_site:
            raise Refused(f"{name}: the site floor: {'; '.join(under_site)}. The site floor "
                          "(guards.min_free_gpus in the configuration) is never lowered, not "
                          "even by break-glass")
        reasons = [f"capacity guard: {check.name}: {outcome.detail}" for check, outcome in short
                   if not outcome.passed]
        reasons += [guard.describe() for guard in weakened]
        plan = dataclasses.replace(plan, capacity=[
            f"{check.name}: {outcome.detail}" for check, outcome in short])
        if not reasons:
            return plan
        if not break_glass:
            raise Refused(f"{name}: {'; '.join(reasons)}. To go ahead anyway ask for "
                          "break-glass (--break-glass): it needs one more approval")
        return with_break_glass(plan, weakened)

    def _audit_facts(self, loaded: LoadedRunbook) -> dict[str, Any]:
        """Facts from what the bot did before; looked up only for runbooks that use them
        (the lookup reads the audit log)."""
        if "previous_driver_version" not in loaded.source:
            return {"previous_driver_version": None}
        with self.db.connect() as conn:
            return {"previous_driver_version": audit.previous_driver_version(conn)}

    def request(self, name: str, raw: Mapping[str, str], user: str, source: str = "cli",
                *, configured: bool = False, break_glass: bool = False,
                preapproved: Preapproval | None = None,
                also: Callable[[Connection, int], None] | None = None,
                window_id: int | None = None, warning: str | None = None) -> int:
        """Validate, plan and record a run request; returns the execution ID.

        ``configured``: the configuration itself asks (an alert rule with auto_run), so
        the requester need not be one of the configured requesters.
        ``preapproved``: approvals collected ahead (schedules, windows); see Preapproval.
        ``also``: runs inside the request's transaction with the new execution ID (a
        schedule records its run there: recorded once with its execution, or not at all).
        ``window_id``: that maintenance window itself asks (a runbook inside it, its
        close-window): the run may take the node locks the window holds (bot.execution.locking).
        """
        extras = _Extras(preapproved, also, window_id, warning)
        try:
            return self._request(name, raw, user, source, configured, break_glass, extras)
        except (Refused, locking.LockConflict, RunbookError) as exc:
            shown = secrets.scrub_raw(self.known(name), raw)
            self.record_refused(name, user, source, str(exc),
                                {k[:41]: _clip(v) for k, v in shown.items()})
            raise Refused(str(exc)) from exc

    def record_refused(self, name: str, user: str, source: str, reason: str,
                       shown: Mapping[str, str] | None = None) -> None:
        """One ``refused`` audit event for a request refused before it ran (also one a
        surface refused before asking, like a command line the parser could not read)."""
        with self.db.begin() as conn:
            audit.append(conn, Kind.REFUSED, user, {
                "runbook": name[:64], "params": dict(shown or {}),
                "source": source, "reason": reason[:2000],
            })

    def _request(self, name: str, raw: Mapping[str, str], user: str, source: str,
                 configured: bool, break_glass: bool, extras: _Extras) -> int:
        if not configured and not self.config.matches(user, self.config.requesters,
                                                      requesting=True):
            raise Refused(f"{user} may not request runbooks (requesters: "
                          f"{', '.join(self.config.requesters)})")
        plan = self.plan(name, raw, break_glass=break_glass)
        if extras.warning:  # shown to the approvers with the plan, not part of its hash
            plan = dataclasses.replace(plan, warnings=[*plan.warnings, extras.warning])
        problem = unapprovable(plan.approval, name, user)
        if problem is not None:
            raise Refused(problem)
        now = time.time()
        deadline = now + plan.approval.expires_seconds if plan.approval.required else None
        lock_until = max(now + self.config.engine.lock_ttl_seconds, (deadline or now) + 60)
        loaded = self.runbook(name)
        args = (plan, loaded, user, source, now, deadline, lock_until, extras)
        try:
            return self._record_request(*args)
        except IntegrityError:
            # Another request took one of the locks between our read and our write
            # (PostgreSQL); the second attempt sees it and refuses with its holder.
            return self._record_request(*args)

    def _record_request(self, plan: Plan, loaded: LoadedRunbook, user: str, source: str,
                        now: float, deadline: float | None, lock_until: float,
                        extras: _Extras) -> int:
        with self.db.begin() as conn:
            execution_id = executions.create(conn, plan, user, loaded.runbook.resume, deadline,
                                             source)
            token = locking.acquire(conn, plan.locks, execution_id, user, lock_until, now,
                                    window_id=extras.window_id)
            executions.set_fields(conn, execution_id, fencing_token=token)
            audit.append(conn, Kind.REQUESTED, user, {
                "runbook": plan.runbook, "version": plan.version,
                "content_hash": plan.content_hash, "params": plan.params, "source": source,
                **({"change": plan.change} if plan.change else {}),
            }, execution_id)
            audit.append(conn, Kind.PLANNED, user, {
                "plan_hash": plan.hash, "locks": plan.locks, "fencing_token": token,
                "break_glass": plan.break_glass,
                **({"outside_window": True} if plan.outside_window else {}),
                "approval": plan.approval.describe(),
                "operations": [op for s in plan.steps for op in s.operations],
            }, execution_id)
            if extras.preapproved is not None:
                self._apply_preapproval(conn, execution_id, plan, user, extras.preapproved)
            if extras.also is not None:
                extras.also(conn, execution_id)
        return execution_id

    def _apply_preapproval(self, conn: Connection, execution_id: int, plan: Plan, user: str,
                           ahead: Preapproval) -> None:
        """Record approvals given ahead, when they bind to this very plan and the policy
        accepts their authors; the execution is approved once there are enough."""
        policy = plan.approval
        if policy.required == 0:
            return
        if plan.hash != ahead.plan_hash:
            audit.append(conn, Kind.PREAPPROVAL_VOIDED, "bot", {
                "subject": ahead.subject, "approved_plan_hash": ahead.plan_hash,
                "plan_hash": plan.hash, "approvers": list(ahead.approvers),
                "why": "the pre-approved plan no longer matches the plan made now: it does "
                       "not run unattended and waits for approval like any request",
            }, execution_id)
            return
        counted: list[str] = []
        for approver in dict.fromkeys(ahead.approvers):
            problem = approval_problem(self.config, plan.approval, plan.runbook, approver, user)
            if problem is not None:
                audit.append(conn, Kind.APPROVAL_REFUSED, approver,
                             {"reason": problem, "ahead": ahead.subject}, execution_id)
                continue
            executions.record_decision(conn, execution_id, approver, "approve", plan.hash,
                                       f"approved ahead on {ahead.subject}")
            counted.append(approver)
            audit.append(conn, Kind.APPROVED, approver, {
                "plan_hash": plan.hash, "approvals": len(counted), "required": policy.required,
                "ahead": ahead.subject,
            }, execution_id)
        if len(counted) >= policy.required:
            executions.set_fields(conn, execution_id, state=State.APPROVED)

    # --- decisions ----------------------------------------------------------------------

    def approve(self, execution_id: int, user: str, source: str = "cli",
                plan_hash: str | None = None) -> Execution:
        """Record one approval of the plan the approver saw; enough of them approve the
        execution. The decision is a compare-and-set on the execution row: an approval
        racing a denial, an expiry or a changed plan is refused with what it found.
        ``plan_hash`` (its first 6+ characters): the plan the approver saw, which must be
        the execution's in that same compare-and-set. ``source``: the surface it came
        from (cli, chat), kept in its audit event."""
        seen = _seen_hash(plan_hash)
        self.get(execution_id)  # ends it first if its approval window has passed
        try:
            with self.db.begin() as conn:
                ex = self._awaiting(conn, execution_id, user, "approve")
                problem = self._may_decide(ex, user)
                if problem is None and seen and not ex.plan_hash.startswith(seen):
                    problem = (f"the plan changed: execution {ex.id}'s plan is now "
                               f"{ex.plan_hash[:12]}, not the {seen[:12]} you approved; look "
                               f"at it again (status {ex.id})")
                if problem is None:
                    problem = self._decide(conn, ex, user)
                if problem is not None:
                    audit.append(conn, Kind.APPROVAL_REFUSED, user, {"reason": problem}, ex.id)
                    refusal = Refused(problem)
                else:
                    return self._count_approval(conn, ex, user, source)
        except IntegrityError as exc:  # the constraint caught a second decision
            raise Refused(f"{user} has already decided on execution {execution_id}") from exc
        raise refusal

    def _decide(self, conn: Connection, ex: Execution, user: str) -> str | None:
        """Take the execution row for this decision (compare-and-set on the state and plan
        the decider saw); why not, or None."""
        if not executions.update_if(conn, ex.id, {"state": State.AWAITING_APPROVAL,
                                                  "plan_hash": ex.plan_hash}):
            now = executions.get(conn, ex.id)
            if now.plan_hash != ex.plan_hash:
                return f"the plan of execution {ex.id} changed: look at it again"
            return f"execution {ex.id} is {now.state}: there is nothing to decide"
        decided = conn.execute(
            sa_select(approvals.c.decision).where(
                approvals.c.execution_id == ex.id, approvals.c.user == user,
                approvals.c.plan_hash == ex.plan_hash)
        ).scalar()
        if decided is not None:
            verb = "approved" if decided == "approve" else "denied"
            return f"{user} has already {verb} execution {ex.id}"
        return None

    def _count_approval(self, conn: Connection, ex: Execution, user: str,
                        source: str) -> Execution:
        policy = ex.plan.approval
        executions.record_decision(conn, ex.id, user, "approve", ex.plan_hash, None)
        count = len(executions.approvals_for(conn, ex.id, ex.plan_hash))
        audit.append(conn, Kind.APPROVED, user, {
            "plan_hash": ex.plan_hash, "approvals": count, "required": policy.required,
            "source": source,
        }, ex.id)
        if count >= policy.required:
            executions.update_if(conn, ex.id, {"state": State.AWAITING_APPROVAL},
                                 state=State.APPROVED)
        return executions.get(conn, ex.id)

    def deny(self, execution_id: int, user: str, reason: str | None,
             source: str = "cli") -> Execution:
        self.get(execution_id)
        try:
            with self.db.begin() as conn:
                ex = self._awaiting(conn, execution_id, user, "deny")
                problem = self._may_decide(ex, user, denying=True)
                if problem is None:
                    problem = self._decide(conn, ex, user)
                if problem is None:
                    executions.record_decision(conn, ex.id, user, "deny", ex.plan_hash, reason)
                    audit.append(conn, Kind.DENIED, user,
                                 {"plan_hash": ex.plan_hash, "reason": reason,
                                  "source": source}, ex.id)
                    executions.finish(conn, ex, State.DENIED, user,
                                      f"denied by {user}: {reason or ''}",
                                      expect={"state": State.AWAITING_APPROVAL})
                    return executions.get(conn, ex.id)
                audit.append(conn, Kind.APPROVAL_REFUSED, user, {"reason": problem}, ex.id)
        except IntegrityError as exc:
            raise Refused(f"{user} has already decided on execution {execution_id}") from exc
        raise Refused(problem)

    def cancel(self, execution_id: int, user: str) -> Execution:
        """Not started: ended at once. Running: flagged; the engine stops the step under way
        within about a second and undoes what was done. Held: undone by the next engine."""
        with self.db.begin() as conn:
            ex = self._get(conn, execution_id)
            if ex.terminal:
                raise Refused(f"execution {ex.id} has already ended ({ex.state})")
            if not self._may_steer(ex, user):
                raise Refused(f"{user} may not cancel execution {ex.id}: only its requester "
                              f"({ex.requested_by}) or its approvers may")
            if ex.state == State.HELD:
                done = executions.update_if(conn, ex.id, {"state": State.HELD},
                                            state=State.UNDOING, cancel_requested=True)
            else:  # compare-and-set on the state we saw (a bare bump when not started)
                started = ex.state not in NOT_STARTED
                flag = {"cancel_requested": True} if started else {}
                done = executions.update_if(conn, ex.id, {"state": ex.state}, **flag)
            if done:
                audit.append(conn, Kind.CANCEL_REQUESTED, user, {"state": ex.state}, ex.id)
                if ex.state in NOT_STARTED:
                    executions.finish(conn, ex, State.CANCELLED, user, f"cancelled by {user}",
                                      expect={"state": ex.state})
                return executions.get(conn, ex.id)
        # the execution moved on between our read and our write: look again
        return self.cancel(execution_id, user)

    def resume(self, execution_id: int, user: str) -> Execution:
        with self.db.begin() as conn:
            ex = self._get(conn, execution_id)
            if ex.state != State.HELD:
                raise Refused(f"execution {ex.id} is {ex.state}, not held: nothing to resume")
            if not self._may_steer(ex, user):
                raise Refused(f"{user} may not resume execution {ex.id}")
            if not executions.update_if(conn, ex.id, {"state": State.HELD},
                                        state=State.RUNNING, resume_requested=True):
                raise Refused(f"execution {ex.id} changed while resuming it: look again")
            audit.append(conn, Kind.RESUME_REQUESTED, user, {"stage": ex.stage}, ex.id)
            return executions.get(conn, ex.id)

    def confirm(self, execution_id: int, user: str, yes: bool, note: str | None, *,
                step: str | None = None, plan_hash: str | None = None) -> str:
        """Answer the question a running step asked (chat.confirm); returns the question.

        ``step`` and ``plan_hash``: the question and plan the answer was given for (a Yes/No
        button carries them); an answer given for another question is refused, never
        applied to the one pending now."""
        with self.db.begin() as conn:
            ex = self._get(conn, execution_id)
            question = confirming.pending(conn, ex.id)
            stale = confirming.stale_answer(conn, ex.id, ex.plan_hash, question, step,
                                            plan_hash)
            if stale is not None:
                raise Refused(stale)
            if ex.state != State.RUNNING or question is None:
                raise Refused(f"execution {ex.id} is not waiting for a confirmation")
            if not self._may_steer(ex, user):
                raise Refused(f"{user} may not answer for execution {ex.id}: only its "
                              f"requester ({ex.requested_by}) or its approvers may")
            confirming.record_answer(conn, ex.id, question.step_id, "yes" if yes else "no",
                                     user, note)
            return str(question.question)

    def _get(self, conn: Connection, execution_id: int) -> Execution:
        try:
            return executions.get(conn, execution_id)
        except executions.NotFound as exc:
            raise Refused(str(exc)) from exc

    def _awaiting(self, conn: Connection, execution_id: int, user: str, verb: str) -> Execution:
        ex = self._get(conn, execution_id)
        if ex.state != State.AWAITING_APPROVAL:
            raise Refused(f"execution {ex.id} is {ex.state}: there is nothing to {verb}")
        return ex

    def _may_steer(self, ex: Execution, user: str) -> bool:
        return may_steer(self.config, user, ex.requested_by, ex.plan.approval.approvers)

    def _may_decide(self, ex: Execution, user: str, denying: bool = False) -> str | None:
        return approval_problem(self.config, ex.plan.approval, ex.runbook, user, ex.requested_by,
                                     denying=denying, asked=f"requested execution {ex.id}")

    # --- reading ---------------------------------------------------------------------

    def get(self, execution_id: int) -> Execution:
        with self.db.begin() as conn:
            ex = self._get(conn, execution_id)
            if ex.state == State.AWAITING_APPROVAL and executions.expire_if_due(conn, ex):
                ex = executions.get(conn, ex.id)
            return ex

    def timeline(self, execution_id: int) -> tuple[Execution, list[dict[str, Any]]]:
        with self.db.connect() as conn:
            ex = self._get(conn, execution_id)
            return ex, list(audit.events(conn, execution_id=execution_id))

    def step_states(self, execution_id: int) -> dict[tuple[str, str], executions.StepState]:
        """Each step's row by (phase, step id): its state and result (node states too)."""
        with self.db.connect() as conn:
            return executions.step_states_of(conn, execution_id)

    def approvals(self, execution_id: int) -> list[str]:
        with self.db.connect() as conn:
            ex = self._get(conn, execution_id)
            return executions.approvals_for(conn, ex.id, ex.plan_hash)

    def history(self, *, runbook: str | None = None, user: str | None = None,
                node: str | None = None, limit: int = 200) -> list[Execution]:
        """Executions, newest first, of this runbook, requester or node (each optional)."""
        with self.db.connect() as conn:
            return executions.find(conn, runbook=runbook, user=user, node=node, limit=limit)

    def versions_of(self, name: str) -> list[versions.Version]:
        """Each recorded version of the runbook ``name``, first seen first."""
        with self.db.connect() as conn:
            return versions.listing(conn, name)

    def version_diff(self, name: str, old: str, new: str) -> str:
        """A unified diff of two recorded versions; KeyError naming one never seen."""
        with self.db.connect() as conn:
            return versions.diff(conn, name, old, new)


@dataclass(frozen=True)
class _Extras:
    preapproved: Preapproval | None = None
    also: Callable[[Connection, int], None] | None = None
    window_id: int | None = None  # a run of this maintenance window: it may take its node locks
    warning: str | None = None  # for the approvers (a proposal whose alert resolved)


def _text(value: Any) -> str:
    """A stored parameter value as it was given on the command line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _clip(value: str, limit: int = 200) -> str:
    return value if len(value) <= limit else value[:limit] + f"… ({len(value)} characters)"


def repeat_text(node: str, found: Sequence[tuple[int, str]], days: float) -> str:
    """"gpu03 is a repeat offender: 3 remediations in 30 days (executions 4 drain-node, ...)"."""
    listed = ", ".join(f"{ex_id} {runbook}" for ex_id, runbook in found)
    return (f"{node} is a repeat offender: {len(found)} remediations in {days:g} days "
            f"(executions {listed})")
