"""The default Slurm backend: Slurm's own client programs, run as argument lists.

Every call gets a clean environment (none of the bot's secrets; ``SLURM_CONF`` when
configured), a timeout and stdin from /dev/null; never a shell.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Protocol

from adapters.environment import child_environment
from adapters.slurm import commands, parsing, restparse
from adapters.slurm.backend import (
    AccountUsage,
    Job,
    NodeInfo,
    Reservation,
    SlurmctldUnreachable,
    SlurmError,
)
from adapters.slurm.config import SlurmConfig
from kit.hostlist import compress

UNREACHABLE = "Unable to contact slurm controller"
# scontrol, sacctmgr and sdiag print data_parser JSON from 23.02 (proven on 24.11 and 26.05);
# before that (22.05) only sinfo, squeue and sacct do, and the rest is read as text.
JSON_CLIENTS_SINCE = (23, 2)
# 22.05 says "Problem talking to the database"; 24.11+ only "failed to open persistent
# connection to host:...: Connection refused" (sacctmgr, sacct, sshare)
DBD_UNREACHABLE = ("Problem talking to the database", "Unable to connect to database",
                   "failed to open persistent connection",
                   "slurmdbd: Connection refused")


class Runner(Protocol):
    """Runs one command; tests inject their own to count or fake calls."""

    def __call__(
        self, argv: list[str], *, env: Mapping[str, str], timeout: float
    ) -> subprocess.CompletedProcess[str]: ...


def run_process(
    argv: list[str], *, env: Mapping[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """subprocess.run, but a timeout sends SIGTERM first (srun then ends its job step)."""
    with subprocess.Popen(
        argv, env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            try:
                out, err = proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            raise subprocess.TimeoutExpired(argv, timeout, out, err) from None
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)


class CliBackend:
    """``SlurmBackend`` over sinfo/squeue/sacct/scontrol/srun.

    Reads use ``--json``: ``sinfo``/``squeue``/``sacct`` on 22.05, and from 23.02 also
    ``scontrol show nodes|reservation``, ``sacctmgr`` and ``sdiag``; 22.05's scontrol,
    sacctmgr and sdiag text is read only where they have no JSON. Changes use ``scontrol``.
    srun runs with an explicit ``--export=`` list, so nothing else of the bot's
    environment reaches a compute node either.
    """

    def __init__(self, config: SlurmConfig, runner: Runner | None = None) -> None:
        self.config = config
        self._runner: Runner = runner or run_process
        self._version: tuple[int, int] | None = None

    def unsupported(self, operation: str) -> str | None:
        """Never a reason: Slurm's own programs do every operation."""
        return None

    # -- plumbing ---------------------------------------------------------------------

    def _env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The clean environment of a Slurm client; ``extra`` (a node command's ``env:``)
        comes before the adapter's own SLURM_CONF, which it cannot replace."""
        own = dict(extra or {})
        if self.config.slurm_conf:
            own["SLURM_CONF"] = self.config.slurm_conf
        return child_environment(own)

    def _argv(self, argv: list[str]) -> list[str]:
        if self.config.bin_dir:
            return [os.path.join(self.config.bin_dir, argv[0]), *argv[1:]]
        return list(argv)

    def run(self, argv: list[str], timeout: float | None = None, check: bool = True,
            env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client; raise SlurmError (SlurmctldUnreachable) with its stderr."""
        full = self._argv(argv)
        limit = timeout if timeout is not None else self.config.timeout
        try:
            done = self._runner(full, env=self._env(env), timeout=limit)
        except FileNotFoundError as exc:
            where = self.config.bin_dir or "PATH"
            raise SlurmError(
                f"{argv[0]} not found in {where}: install the Slurm client programs or set "
                "slurm.bin_dir in the configuration", argv
            ) from exc
        except subprocess.TimeoutExpired as exc:
            stderr = exc.stderr if isinstance(exc.stderr, str) else ""
            raise SlurmError(f"{shlex.join(argv)} timed out after {limit:.0f}s", argv,
                             stderr) from exc
        if check and done.returncode != 0:
            raise self._error(argv, done.returncode, done.stderr or done.stdout)
        return done

    def _error(self, argv: list[str], code: int, stderr: str) -> SlurmError:
        if UNREACHABLE in stderr:
            return unreachable(argv, stderr)
        if any(marker in stderr for marker in DBD_UNREACHABLE):
            return SlurmError(
                f"slurmdbd is not answering ({argv[0]}): check that slurmdbd and its "
                "database run", argv, stderr)
        return SlurmError(f"{shlex.join(argv)} failed (exit {code})", argv, stderr)

    def _json(self, argv: list[str]) -> dict[str, Any]:
        done = self.run(argv)
        try:
            data = json.loads(done.stdout)
        except ValueError as exc:
            raise SlurmError(f"{shlex.join(argv)} printed no JSON", argv,
                             done.stderr or done.stdout[:500]) from exc
        if not isinstance(data, dict):
            raise SlurmError(f"{shlex.join(argv)} printed unexpected JSON", argv)
        errors = parsing.json_errors(data)
        if errors:
            # 22.05 clients print {"errors": [{"error": "Unspecified error"}]} and exit 0
            # when slurmctld is down: ask the controller directly to tell which it is.
            detail = "; ".join(errors)
            ping = self.run(["scontrol", "ping"], check=False)
            if ping.returncode != 0 or "DOWN" in ping.stdout:
                answer = " ".join((ping.stdout + ping.stderr).split()[:6])
                raise unreachable(argv, f"{detail}; scontrol ping: {answer}")
            raise SlurmError(f"{shlex.join(argv)} reported errors", argv, detail)
        return data

    def version(self) -> tuple[int, int]:
        if self._version is None:
            done = self.run(["sinfo", "--version"])
            try:
                self._version = parsing.parse_version(done.stdout)
            except ValueError as exc:
                raise SlurmError(str(exc), ["sinfo", "--version"]) from exc
        return self._version

    def json_clients(self) -> bool:
        """Whether scontrol, sacctmgr and sdiag print JSON (``--json``, 23.02+)."""
        return self.version() >= JSON_CLIENTS_SINCE

    # -- reads ------------------------------------------------------------------------

    def nodes(self, names: list[str] | None = None, *, with_jobs: bool = True) -> list[NodeInfo]:
        if names is not None and not with_jobs:
            return self._node_states(names)
        if self.json_clients():
            data = self._json(["scontrol", "show", "nodes", "--json"])
        else:
            data = self._json(["sinfo", "--json"])
        found = parsing.parse_nodes(data)
        return parsing.with_jobs(found, names, self._all_jobs() if with_jobs else [])

    def _node_states(self, names: list[str]) -> list[NodeInfo]:
        """The quick read: only the named nodes, filtered by slurmctld. 23.02+: ``scontrol
        show node HOSTLIST --json`` (unknown names are left out). 22.05: ``scontrol show node
        -o HOSTLIST`` text (its sinfo JSON printer costs ~25 ms per 256 nodes, this ~3 ms);
        unknown names make it exit 1 ("Node gpu99 not found") after printing the others.
        """
        if not names:
            return []
        if self.json_clients():
            data = self._json(["scontrol", "show", "node", compress(names), "--json"])
            return parsing.with_jobs(parsing.parse_nodes(data), names, [])
        argv = ["scontrol", "show", "node", "-o", compress(names)]
        done = self.run(argv, check=False)
        if done.returncode != 0:
            problems = [line for line in (done.stderr + done.stdout).splitlines()
                        if line.strip() and not line.startswith("NodeName=")
                        and not re.match(r"^Node \S+ not found$", line.strip())]
            if problems or (not done.stdout.strip() and "not found" not in done.stderr):
                raise self._error(argv, done.returncode, done.stderr or done.stdout)
        wanted = set(names)
        found = {n.name: n for n in parsing.parse_node_text(done.stdout) if n.name in wanted}
        return [found[name] for name in names if name in found]

    def _all_jobs(self) -> list[Job]:
        return parsing.parse_jobs(self._json(["squeue", "--json"]))

    def jobs(self, names: list[str]) -> list[Job]:
        wanted = set(names)
        return [
            job for job in self._all_jobs()
            if (job.active or job.state == "PENDING") and wanted.intersection(job.nodes)
        ]

    def reservations(self) -> list[Reservation]:
        if self.json_clients():  # the data_parser JSON slurmrestd answers too
            data = self._json(["scontrol", "show", "reservation", "--json"])
            return restparse.parse_reservations(data)
        done = self.run(["scontrol", "show", "reservation", "-o"])
        return parsing.parse_reservations(done.stdout)

    def accounting(self, start: datetime, end: datetime) -> list[AccountUsage]:
        fmt = "%Y-%m-%dT%H:%M:%S"
        argv = ["sacct", "--json", "--allusers", "-X",
                "-S", _local(start).strftime(fmt), "-E", _local(end).strftime(fmt)]
        try:
            data = self._json(argv)
        except SlurmError as exc:
            if "Nothing found" in exc.stderr:  # 22.05: no job in the period is an "error"
                return []
            raise
        return parsing.parse_accounting(data, start, end)

    # -- changes ----------------------------------------------------------------------

    def update_nodes(self, names: list[str], state: str, reason: str | None = None) -> None:
        self.run(commands.update_nodes(names, state, reason))

    def update_features(self, names: list[str], features: list[str]) -> None:
        self.run(commands.update_features(names, features))

    def requeue(self, job_ids: list[int]) -> None:
        if job_ids:
            self.run(commands.requeue(job_ids))

    def create_reservation(
        self, name: str, nodes: list[str], start: str, duration_seconds: float,
        flags: list[str], users: list[str],
    ) -> None:
        self.run(commands.create_reservation(name, nodes, start, duration_seconds, flags, users))

    def delete_reservation(self, name: str) -> None:
        self.run(commands.delete_reservation(name))

    def reboot(self, names: list[str], nextstate: str, reason: str) -> None:
        self.run(commands.reboot(names, nextstate, reason))

    def node_run_line(self, node: str, reservation: str | None, argv: list[str],
                      env_names: Iterable[str] = ()) -> str:
        return commands.show(commands.srun(node, reservation, argv, env_names))

    def run_on_node(
        self, node: str, reservation: str | None, argv: list[str], timeout: float,
        env: Mapping[str, str] | None = None,
    ) -> tuple[int, str, str]:
        line = commands.srun(node, reservation, argv, env or {})
        done = self.run(line, timeout=timeout, check=False, env=env)
        if done.returncode != 0 and UNREACHABLE in done.stderr:
            raise unreachable(line, done.stderr)
        return done.returncode, done.stdout, done.stderr

    def run_on_nodes(
        self, nodes: list[str], reservation: str | None, argv: list[str], timeout: float,
        env: Mapping[str, str] | None = None, tasks_per_node: int = 1,
    ) -> tuple[int, str, str]:
        line = commands.srun_nodes(nodes, reservation, argv, env or {}, tasks_per_node,
                                   self.config.nccl.mpi)
        done = self.run(line, timeout=timeout, check=False, env=env)
        if done.returncode != 0 and UNREACHABLE in done.stderr:
            raise unreachable(line, done.stderr)
        return done.returncode, done.stdout, done.stderr

    def accounts(self) -> list[str]:
        if self.json_clients():
            return restparse.parse_accounts(self._json(["sacctmgr", "show", "account",
                                                        "--json"]))
        done = self.run(["sacctmgr", "--noheader", "--parsable2", "list", "account",
                         "format=account"])
        return [line.strip() for line in done.stdout.splitlines() if line.strip()]

    def dbd_queue(self) -> int:
        if self.json_clients():
            size = restparse.dbd_agent_queue(self._json(["sdiag", "--json"]))
            if size is None:
                raise SlurmError("sdiag --json printed no dbd_agent_queue_size",
                                 ["sdiag", "--json"])
            return size
        done = self.run(["sdiag"])
        match = re.search(r"DBD Agent queue size:\s*(\d+)", done.stdout)
        if match is None:
            raise SlurmError("sdiag printed no DBD Agent queue size", ["sdiag"], done.stdout)
        return int(match.group(1))


def unreachable(argv: list[str], stderr: str) -> SlurmctldUnreachable:
    detail = " ".join(stderr.strip().splitlines()[-1:]) or "no answer"
    return SlurmctldUnreachable(
        f"slurmctld is not answering ({argv[0]}: {detail}): check that slurmctld runs "
        "and that SLURM_CONF points at this cluster's slurm.conf",
        argv,
        stderr,
    )


def _local(moment: datetime) -> datetime:
    """Slurm reads times without a zone as local time."""
    return moment.astimezone() if moment.tzinfo else moment
