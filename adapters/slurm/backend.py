"""What the Slurm adapter knows of a cluster: records, the backend Protocol and its errors."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import ClassVar, Protocol

from adapters.actions import ActionError

# Base states as lower-case words; everything else Slurm reports about a node is a flag.
BASE_STATES = frozenset(
    {"idle", "mixed", "allocated", "down", "error", "future", "unknown", "completing"}
)
BUSY_STATES = frozenset({"mixed", "allocated", "completing"})
REBOOT_FLAGS = frozenset({"REBOOT_REQUESTED", "REBOOT_ISSUED"})
# Job states in which a job occupies (or is about to occupy) its nodes.
ACTIVE_JOB_STATES = frozenset(
    {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "RESIZING"}
)


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str  # base state, lower case: idle, mixed, allocated, down, ...
    flags: frozenset[str] = frozenset()  # upper case: DRAIN, MAINTENANCE, NOT_RESPONDING, ...
    reason: str = ""
    reason_user: str | None = None
    reason_time: int | None = None  # epoch seconds
    gpus_total: int = 0
    gpus_used: int = 0
    jobs: list[int] = field(default_factory=list)
    boot_time: int | None = None  # epoch seconds, when Slurm knows it
    features: frozenset[str] = frozenset()  # AvailableFeatures (jobs ask with --constraint)
    gres: str = ""  # as Slurm shows it: gpu:h100:8, gpu:3g.40gb:16 (MIG)

    @property
    def drained(self) -> bool:
        """DRAIN set and nothing runs any more (idle/down + DRAIN)."""
        return "DRAIN" in self.flags and self.state not in BUSY_STATES

    @property
    def draining(self) -> bool:
        """DRAIN set while jobs still run (mixed/allocated + DRAIN)."""
        return "DRAIN" in self.flags and self.state in BUSY_STATES

    @property
    def idle_ish(self) -> bool:
        """No job runs on the node (whatever its other flags say)."""
        return (
            self.state not in BUSY_STATES and "COMPLETING" not in self.flags and not self.jobs
        )

    @property
    def responding(self) -> bool:
        return "NOT_RESPONDING" not in self.flags

    def describe(self) -> str:
        words = "+".join([self.state, *sorted(self.flags)])
        text = f"{self.name}: {words}, {self.gpus_used}/{self.gpus_total} GPUs used"
        if self.jobs:
            text += f", jobs {','.join(map(str, self.jobs))}"
        if self.reason:
            text += f', reason "{self.reason}"'
            if self.reason_user:
                text += f" by {self.reason_user}"
        return text

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "state": self.state,
            "flags": sorted(self.flags),
            "reason": self.reason,
            "reason_user": self.reason_user,
            "reason_time": self.reason_time,
            "gpus_total": self.gpus_total,
            "gpus_used": self.gpus_used,
            "jobs": list(self.jobs),
            "drained": self.drained,
            "draining": self.draining,
        }


@dataclass(frozen=True)
class Job:
    id: int
    name: str
    user: str
    account: str
    state: str  # upper case: RUNNING, PENDING, ...
    nodes: list[str] = field(default_factory=list)  # allocated (or, pending, required) nodes

    @property
    def active(self) -> bool:
        """Runs on its nodes (or is finishing there); pending jobs are not active."""
        return self.state in ACTIVE_JOB_STATES

    def describe(self) -> str:
        return f"{self.id} (user {self.user}, name {self.name}, {self.state.lower()})"


@dataclass(frozen=True)
class Reservation:
    name: str
    nodes: list[str]
    start: str  # as Slurm prints it (local time, ISO 8601 without zone)
    end: str
    flags: frozenset[str] = frozenset()
    users: list[str] = field(default_factory=list)
    state: str = ""


@dataclass(frozen=True)
class AccountUsage:
    account: str
    gpu_hours: float
    jobs: int
    mean_queue_wait_seconds: float


class SlurmError(ActionError):
    """Slurm refused or failed; carries the command line and Slurm's own words."""

    def __init__(self, message: str, argv: Sequence[str] = (), stderr: str = "") -> None:
        self.argv = list(argv)
        self.stderr = stderr.strip()
        self.message = message
        text = message
        if self.argv and shlex.join(self.argv) not in message:
            text += f" [{shlex.join(self.argv)}]"
        if self.stderr and self.stderr not in message:
            text += f": {self.stderr}"
        super().__init__(text)


class SlurmctldUnreachable(SlurmError):
    """slurmctld does not answer: nothing can be read or changed until it runs again."""


# The Protocol's operations, by method name (what ``unsupported`` is asked about).
OPERATIONS = ("nodes", "update_nodes", "update_features", "jobs", "requeue", "reservations",
              "create_reservation", "delete_reservation", "reboot", "run_on_node",
              "run_on_nodes", "accounting", "accounts", "dbd_queue")


def unsupported(backend: object, operation: str) -> str | None:
    """Why ``backend`` refuses ``operation`` (its ``unsupported`` method, when it has one:
    the rest backend on an old slurmrestd); None when it carries it out."""
    if operation not in OPERATIONS:
        raise ValueError(f"{operation!r} is not a SlurmBackend operation")
    ask = getattr(backend, "unsupported", None)
    return ask(operation) if callable(ask) else None


class SlurmBackend(Protocol):
    """One method per Slurm operation. Names are expanded node names, never expressions."""

    def nodes(self, names: list[str] | None = None, *, with_jobs: bool = True) -> list[NodeInfo]:
        """The named nodes (all when None); unknown names are simply absent.

        ``with_jobs=False`` leaves ``NodeInfo.jobs`` empty and saves the job query.
        """
        ...

    def update_nodes(self, names: list[str], state: str, reason: str | None = None) -> None:
        """One ``scontrol update`` for the whole batch."""
        ...

    def update_features(self, names: list[str], features: list[str]) -> None:
        """Set the nodes' available and active features (``scontrol update ...
        AvailableFeatures=a,b ActiveFeatures=a,b``)."""
        ...

    def jobs(self, names: list[str]) -> list[Job]:
        """Running and pending jobs on (or asking for) those nodes."""
        ...

    def requeue(self, job_ids: list[int]) -> None: ...

    def reservations(self) -> list[Reservation]: ...

    def create_reservation(
        self,
        name: str,
        nodes: list[str],
        start: str,
        duration_seconds: float,
        flags: list[str],
        users: list[str],
    ) -> None: ...

    def delete_reservation(self, name: str) -> None: ...

    def reboot(self, names: list[str], nextstate: str, reason: str) -> None: ...

    def run_on_node(
        self, node: str, reservation: str | None, argv: list[str], timeout: float,
        env: Mapping[str, str] | None = None,
    ) -> tuple[int, str, str]:
        """Run ``argv`` on ``node`` through srun (no shell); (exit code, stdout, stderr).

        The job step gets only the allow-listed variables and ``env`` (the node command's
        ``env:``), never the rest of the bot's environment."""
        ...

    def node_run_line(self, node: str, reservation: str | None, argv: list[str],
                      env_names: Iterable[str] = ()) -> str:
        """How ``run_on_node`` runs ``argv``, as a plan shows it (the srun line, or the
        batch job slurmrestd runs), so what is approved is what this backend does."""
        ...

    def run_on_nodes(
        self, nodes: list[str], reservation: str | None, argv: list[str], timeout: float,
        env: Mapping[str, str] | None = None, tasks_per_node: int = 1,
    ) -> tuple[int, str, str]:
        """Run ``argv`` as one job step across ``nodes`` (``tasks_per_node`` tasks on each,
        an MPI program such as nccl-tests' all_reduce_perf) through srun, no shell, with the
        same environment as ``run_on_node``; (exit code, stdout, stderr) of the whole step.
        The line it runs is ``commands.srun_nodes``'s, which the plan shows."""
        ...

    def accounting(self, start: datetime, end: datetime) -> list[AccountUsage]:
        """GPU-hours, job count and mean queue wait per account for jobs in [start, end)."""
        ...

    def accounts(self) -> list[str]:
        """The accounts slurmdbd lists (sacctmgr); fails when slurmdbd does not answer."""
        ...

    def dbd_queue(self) -> int:
        """Records slurmctld holds for slurmdbd, not yet sent (sdiag "DBD Agent queue size")."""
        ...


class NeedsOperations:
    """An action's backend operations (``needs``), so that a plan is refused when the
    configured backend cannot carry one out (slurmrestd 22.05 cannot drain, pyslurm
    cannot reboot): the request fails before approval, not at its first change."""

    needs: ClassVar[tuple[str, ...]] = ()
    backend: SlurmBackend

    def operations(self, args: object) -> tuple[str, ...]:
        """What ``run(args)`` may ask of the backend; ``needs`` unless args change it."""
        return self.needs

    def refusal(self, args: object) -> str | None:
        """The backend's reason for refusing one of the operations; None when it can."""
        for operation in self.operations(args):
            reason = unsupported(self.backend, operation)
            if reason is not None:
                return reason
        return None
