"""The Slurm command lines the adapter runs, built in one place.

The CLI backend runs them (as argument lists, never through a shell) and the actions
show them in ``plan()``, so what an engineer approves is what runs.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Iterable

from adapters.environment import node_export
from kit.hostlist import compress


def quote_value(value: str) -> str:
    """How scontrol text shows a value: double quotes when it has spaces or quotes."""
    if value and all(c.isalnum() or c in "._-:/,+@[]" for c in value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def show(argv: list[str]) -> str:
    """An argv as an engineer would type it: ``Reason="XID 79"`` rather than shell quoting."""
    words = []
    for word in argv:
        key, sep, value = word.partition("=")
        if sep and key and all(c.isalnum() or c == "_" for c in key):
            words.append(f"{key}={quote_value(value)}")
        else:
            words.append(shlex.quote(word))
    return " ".join(words)


def update_nodes(names: list[str], state: str, reason: str | None) -> list[str]:
    argv = ["scontrol", "update", f"NodeName={compress(names)}", f"State={state}"]
    if reason is not None:
        argv.append(f"Reason={reason}")
    return argv


def update_features(names: list[str], features: list[str]) -> list[str]:
    value = ",".join(features)  # empty: no features
    return ["scontrol", "update", f"NodeName={compress(names)}", f"AvailableFeatures={value}",
            f"ActiveFeatures={value}"]


def requeue(job_ids: list[int]) -> list[str]:
    return ["scontrol", "requeue", ",".join(str(job) for job in job_ids)]


def reservation_minutes(duration_seconds: float) -> int:
    """Slurm keeps reservation durations in whole minutes (it rounds 90 s up to 2 min)."""
    return max(1, math.ceil(duration_seconds / 60))


def slurm_duration(duration_seconds: float) -> str:
    """``[days-]HH:MM:SS`` rounded up to a whole minute, as scontrol prints it."""
    minutes = reservation_minutes(duration_seconds)
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    text = f"{hours:02d}:{mins:02d}:00"
    return f"{days}-{text}" if days else text


def create_reservation(
    name: str, nodes: list[str], start: str, duration_seconds: float,
    flags: list[str], users: list[str],
) -> list[str]:
    return [
        "scontrol", "create", "reservation",
        f"ReservationName={name}",
        f"Nodes={compress(nodes)}",
        f"StartTime={start}",
        f"Duration={slurm_duration(duration_seconds)}",
        f"Flags={','.join(flags)}",
        f"Users={','.join(users)}",
    ]


def delete_reservation(name: str) -> list[str]:
    return ["scontrol", "delete", f"ReservationName={name}"]


def reboot(names: list[str], nextstate: str, reason: str) -> list[str]:
    return ["scontrol", "reboot", "ASAP", f"nextstate={nextstate}", f"reason={reason}",
            compress(names)]


def batch_job_line(node: str, reservation: str | None, argv: list[str]) -> str:
    """How a plan shows a command the rest backend runs as a batch job (slurmrestd has no
    srun): the command is the job's argv, never read by a shell."""
    where = f" in reservation {reservation}" if reservation else ""
    return f"slurmrestd batch job on {node}{where} (exec, no shell): {show(argv)}"


def srun(node: str, reservation: str | None, argv: list[str],
         env_names: Iterable[str] = ()) -> list[str]:
    """srun of one task on ``node``. ``--export=`` names what reaches the job step (besides
    Slurm's own SLURM_*): the allow-listed basics and the command's ``env:`` names, by name
    only, so no value is ever in argv."""
    line = ["srun", "-w", node, "-N1", "-n1", f"--export={node_export(env_names)}"]
    if reservation:
        line.append(f"--reservation={reservation}")
    return [*line, "--", *argv]


def srun_nodes(nodes: list[str], reservation: str | None, argv: list[str],
               env_names: Iterable[str] = (), tasks_per_node: int = 1,
               mpi: str | None = None) -> list[str]:
    """srun of one job step across ``nodes``: ``tasks_per_node`` tasks on each (an MPI
    program's ranks, started through srun's ``--mpi`` plugin when set); ``--export=`` as
    ``srun``'s."""
    line = ["srun", "-w", compress(nodes), f"-N{len(nodes)}",
            f"--ntasks-per-node={tasks_per_node}"]
    if mpi:
        line.append(f"--mpi={mpi}")
    line.append(f"--export={node_export(env_names)}")
    if reservation:
        line.append(f"--reservation={reservation}")
    return [*line, "--", *argv]
