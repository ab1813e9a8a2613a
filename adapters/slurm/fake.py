"""``FakeSlurm``: an in-memory ``SlurmBackend`` for tests, type-checked against the Protocol.

It keeps node states, jobs and reservations as Slurm would and records every change in
``calls``; it never runs a Slurm program. Nothing outside tests may use it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from adapters.slurm import commands
from adapters.slurm.backend import AccountUsage, Job, NodeInfo, Reservation

if TYPE_CHECKING:
    from adapters.slurm.backend import SlurmBackend


class FakeSlurm:
    """Nodes (idle, 8 GPUs each) by name; ``running`` jobs; ``reserved`` reservations.

    ``run_on_node`` succeeds ("Pass") unless its argv holds the word ``fail``: then it exits
    1 the way a failing check does, with the check's line on stdout and srun's on stderr.
    ``run_on_nodes`` prints ``step_output`` (a test's nccl-tests output) and exits with its code.
    A reboot is recorded, never carried out: the node keeps its boot time.
    """

    def __init__(self, nodes: list[str]) -> None:
        self.state = {n: NodeInfo(name=n, state="idle", gpus_total=8) for n in nodes}
        self.running: list[Job] = []
        self.reserved: dict[str, Reservation] = {}
        self.accounts_listed: list[str] = ["root", "ml-research"]  # what sacctmgr lists
        self.dbd_records = 0  # records slurmctld holds for slurmdbd
        self.calls: list[tuple[Any, ...]] = []
        self.envs: list[dict[str, str]] = []  # the env given to each run_on_node
        # what run_on_nodes prints (stdout, exit code); tests set an nccl-tests output
        self.step_output: tuple[str, int] = ("", 0)

    def nodes(self, names: list[str] | None = None, *,
              with_jobs: bool = True) -> list[NodeInfo]:
        wanted = list(self.state) if names is None else names
        found = [self.state[n] for n in wanted if n in self.state]
        if not with_jobs:
            return found
        return [replace(node, jobs=sorted(j.id for j in self.running
                                          if j.active and node.name in j.nodes))
                for node in found]

    def update_nodes(self, names: list[str], state: str, reason: str | None = None) -> None:
        self.calls.append(("update", list(names), state, reason))
        for name in names:
            node = self.state[name]
            flags = (node.flags | {"DRAIN"}) if state == "DRAIN" else node.flags - {"DRAIN"}
            when = int(time.time()) if state == "DRAIN" else None  # as Slurm stamps a reason
            self.state[name] = replace(node, flags=frozenset(flags), reason=reason or "",
                                       reason_time=when)

    def update_features(self, names: list[str], features: list[str]) -> None:
        self.calls.append(("features", list(names), list(features)))
        for name in names:
            self.state[name] = replace(self.state[name], features=frozenset(features))

    def jobs(self, names: list[str]) -> list[Job]:
        return [j for j in self.running
                if (j.active or j.state == "PENDING") and set(j.nodes) & set(names)]

    def requeue(self, job_ids: list[int]) -> None:
        self.calls.append(("requeue", job_ids))
        self.running = [j for j in self.running if j.id not in job_ids]

    def reservations(self) -> list[Reservation]:
        return list(self.reserved.values())

    def create_reservation(self, name: str, nodes: list[str], start: str,
                           duration_seconds: float, flags: list[str], users: list[str]) -> None:
        self.calls.append(("create", name))
        self.reserved[name] = Reservation(name, nodes, "s", "e", frozenset(flags), users)

    def delete_reservation(self, name: str) -> None:
        self.calls.append(("delete", name))
        del self.reserved[name]

    def reboot(self, names: list[str], nextstate: str, reason: str) -> None:
        self.calls.append(("reboot", names, nextstate, reason))

    def node_run_line(self, node: str, reservation: str | None, argv: list[str],
                      env_names: Iterable[str] = ()) -> str:
        return commands.show(commands.srun(node, reservation, argv, env_names))

    def run_on_node(self, node: str, reservation: str | None, argv: list[str],
                    timeout: float, env: Mapping[str, str] | None = None
                    ) -> tuple[int, str, str]:
        self.calls.append(("srun", node, reservation, argv))
        self.envs.append(dict(env or {}))
        return (1, "Row remap | Fail\n", "srun: error: task 0: exit 1\n") if "fail" in argv \
            else (0, "Pass\n", "")

    def run_on_nodes(self, nodes: list[str], reservation: str | None, argv: list[str],
                     timeout: float, env: Mapping[str, str] | None = None,
                     tasks_per_node: int = 1) -> tuple[int, str, str]:
        self.calls.append(("srun", list(nodes), reservation, argv, tasks_per_node))
        self.envs.append(dict(env or {}))
        out, code = self.step_output
        return code, out, "" if code == 0 else f"srun: error: task 0: exit {code}\n"

    def accounting(self, start: datetime, end: datetime) -> list[AccountUsage]:
        return []  # no job ever finished here

    def accounts(self) -> list[str]:
        return list(self.accounts_listed)

    def dbd_queue(self) -> int:
        return self.dbd_records


if TYPE_CHECKING:
    _checked: SlurmBackend = FakeSlurm([])
