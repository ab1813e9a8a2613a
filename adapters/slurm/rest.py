"""The ``rest`` Slurm backend: slurmrestd over HTTP with a JWT; no munge, no Slurm programs.

It speaks the newest API version the server offers (v0.0.38, Slurm 22.05, up to v0.0.45)
and refuses, naming what is needed, what that version lacks (``unsupported``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import requests

from adapters.slurm import commands, parsing, restparse
from adapters.slurm.backend import AccountUsage, Job, NodeInfo, Reservation, SlurmError
from adapters.slurm.config import SlurmConfig
from adapters.slurm.restauth import TokenSource
from adapters.slurm.restclient import VERSIONS, RestClient, release
from adapters.slurm.restjobs import NodeJob
from kit.hostlist import compress


@dataclass(frozen=True)
class Need:
    """What an operation needs of slurmrestd: an endpoint (from ``since``), or none exists."""

    what: str
    method: str | None = None
    path: str | None = None
    since: str | None = None  # the first API version documented to have it


NODE_PATH = "/slurm/{v}/node/{node_name}"
NEEDS = {
    "update_nodes": Need("node update (drain/resume)", "POST", NODE_PATH, "v0.0.39"),
    "update_features": Need("node features update", "POST", NODE_PATH, "v0.0.39"),
    "create_reservation": Need("reservation create", "POST", "/slurm/{v}/reservation",
                               "v0.0.43"),
    "delete_reservation": Need("reservation delete", "DELETE",
                               "/slurm/{v}/reservation/{reservation_name}", "v0.0.43"),
    "dbd_queue": Need("diagnostics (sdiag)", "GET", "/slurm/{v}/diag", "v0.0.38"),
    "requeue": Need("job requeue", "GET", "/slurm/{v}/job/{job_id}/requeue", "v0.0.45"),
    "reboot": Need("node reboot"),
    # a command on a node is a batch job pinned to it (restjobs); v0.0.40 reads job.argv
    "run_on_node": Need("batch job submit with job.argv", "POST", "/slurm/{v}/job/submit",
                        "v0.0.40"),
}


# A job step across nodes needs srun (its MPI launch); slurmrestd runs batch jobs only.
RUN_ON_NODES = ("a test across several nodes (nccl-test) is one srun job step over all of "
                "them, started through srun's MPI plugin; slurmrestd submits batch jobs only, "
                "so the rest backend cannot run it: use slurm.backend: cli")


# The listing cannot tell these: v0.0.38 has /job/submit, but not the job.argv and
# environment list the batch job needs (v0.0.40 on)
BY_VERSION = frozenset({"run_on_node"})


class RestBackend:
    """``SlurmBackend`` over slurmrestd (``slurm.rest``); one request per read.

    The server is asked which API versions it offers on first use (its /openapi/v3
    listing, else a ping per version), unless ``slurm.rest.api_version`` pins one.
    """

    def __init__(self, config: SlurmConfig, tokens: TokenSource | None = None,
                 session: requests.Session | None = None) -> None:
        self.config = config
        self._tokens = tokens or TokenSource(config.rest)
        self._session = session
        self._client: RestClient | None = None

    @property
    def client(self) -> RestClient:
        if self._client is None:
            self._client = RestClient(self.config.rest, self.config.timeout, self._tokens,
                                      self._session)
        return self._client

    @property
    def api_version(self) -> str:
        return self.client.version

    # -- capability ---------------------------------------------------------------------

    def unsupported(self, operation: str) -> str | None:
        """Why this server cannot do ``operation`` (a Protocol method name); None if it can."""
        if operation == "run_on_nodes":
            return RUN_ON_NODES
        need = NEEDS.get(operation)
        if need is None:
            return None
        if operation == "run_on_node" and self.config.rest.job_output_dir is None:
            return ("a command on a node runs as a slurmrestd batch job, whose output the bot "
                    "reads from slurm.rest.job_output_dir (a folder shared by the nodes and "
                    "the bot): set it, or use slurm.backend: cli")
        version = self.client.version
        found = f"slurmrestd {version} ({release(version)})"
        if need.method is None or need.path is None or need.since is None:
            return (f"{found} has no {need.what}: no slurmrestd API version offers it; "
                    "use slurm.backend: cli")
        offered = self.client.offers(need.method, need.path)
        if offered is None or operation in BY_VERSION:  # go by the documented versions
            offered = VERSIONS.index(version) <= VERSIONS.index(need.since)
        if offered:
            return None
        return (f"{found} has no {need.what}; it needs {need.since} ({release(need.since)}) "
                "or later, or slurm.backend: cli")

    def _require(self, operation: str) -> None:
        reason = self.unsupported(operation)
        if reason is not None:
            raise SlurmError(reason)

    # -- reads ------------------------------------------------------------------------

    def nodes(self, names: list[str] | None = None, *, with_jobs: bool = True) -> list[NodeInfo]:
        found = parsing.parse_nodes(self.client.get("/slurm/{v}/nodes"))
        return parsing.with_jobs(found, names, self._all_jobs() if with_jobs else [])

    def _all_jobs(self) -> list[Job]:
        return parsing.parse_jobs(self.client.get("/slurm/{v}/jobs"))

    def jobs(self, names: list[str]) -> list[Job]:
        wanted = set(names)
        return [job for job in self._all_jobs()
                if (job.active or job.state == "PENDING") and wanted.intersection(job.nodes)]

    def reservations(self) -> list[Reservation]:
        return restparse.parse_reservations(self.client.get("/slurm/{v}/reservations"))

    def accounting(self, start: datetime, end: datetime) -> list[AccountUsage]:
        params = {"start_time": _slurm_time(start), "end_time": _slurm_time(end)}
        data = self.client.request("GET", "/slurmdb/{v}/jobs", params=params, allow_empty=True)
        return parsing.parse_accounting(data, start, end)

    def accounts(self) -> list[str]:
        return restparse.parse_accounts(self.client.get("/slurmdb/{v}/accounts"))

    def dbd_queue(self) -> int:
        self._require("dbd_queue")
        size = restparse.dbd_agent_queue(self.client.get("/slurm/{v}/diag"))
        if size is None:
            version = self.client.version
            raise SlurmError(f"slurmrestd {version} ({release(version)}) reports no DBD agent "
                             "queue size in /diag; use slurm.backend: cli (sdiag)")
        return size

    # -- changes ----------------------------------------------------------------------

    def update_nodes(self, names: list[str], state: str, reason: str | None = None) -> None:
        self._require("update_nodes")
        body: dict[str, Any] = {"state": [state.upper()]}
        if reason is not None:
            body["reason"] = reason
            body["reason_uid"] = self._tokens.user
        for name in names:  # one request per node: a node name never needs quoting
            self.client.request("POST", f"/slurm/{{v}}/node/{_plain(name)}", body=body)

    def update_features(self, names: list[str], features: list[str]) -> None:
        self._require("update_features")
        joined = ",".join(features)
        for name in names:
            self.client.request("POST", f"/slurm/{{v}}/node/{_plain(name)}",
                                body={"features": joined, "features_act": joined})

    def requeue(self, job_ids: list[int]) -> None:
        if not job_ids:
            return
        self._require("requeue")
        failed = []
        for job in job_ids:  # v0.0.45 requeues with a GET, one job each (as scontrol)
            answer = self.client.get(f"/slurm/{{v}}/job/{int(job)}/requeue")
            failed += restparse.requeue_failures(answer)
        if failed:
            raise SlurmError(f"slurmrestd did not requeue {'; '.join(failed)}")

    def create_reservation(self, name: str, nodes: list[str], start: str,
                           duration_seconds: float, flags: list[str], users: list[str]) -> None:
        self._require("create_reservation")
        self.client.request("POST", "/slurm/{v}/reservation",
                            body=reservation_body(name, nodes, start, duration_seconds,
                                                  flags, users))

    def delete_reservation(self, name: str) -> None:
        self._require("delete_reservation")
        self.client.request("DELETE", f"/slurm/{{v}}/reservation/{_plain(name)}")

    def reboot(self, names: list[str], nextstate: str, reason: str) -> None:
        self._require("reboot")

    def node_run_line(self, node: str, reservation: str | None, argv: list[str],
                      env_names: Iterable[str] = ()) -> str:
        return commands.batch_job_line(node, reservation, argv)

    def run_on_nodes(self, nodes: list[str], reservation: str | None, argv: list[str],
                     timeout: float, env: Mapping[str, str] | None = None,
                     tasks_per_node: int = 1) -> tuple[int, str, str]:
        raise SlurmError(RUN_ON_NODES)

    def run_on_node(self, node: str, reservation: str | None, argv: list[str],
                    timeout: float, env: Mapping[str, str] | None = None
                    ) -> tuple[int, str, str]:
        self._require("run_on_node")
        folder = self.config.rest.job_output_dir
        assert folder is not None  # _require refuses without it
        return NodeJob(self.client, folder).run(node, reservation, argv, timeout, env or {})


def reservation_body(name: str, nodes: list[str], start: str, duration_seconds: float,
                     flags: list[str], users: list[str]) -> dict[str, Any]:
    """v0.0.43+ ``reservation_desc_msg``: times as epoch number objects, duration in
    minutes (rounded up, as scontrol's Duration=)."""
    begins = datetime.now() if start.lower() == "now" else datetime.fromisoformat(start)
    return {
        "name": name,
        "node_list": compress(nodes),
        "start_time": {"set": True, "infinite": False, "number": int(begins.timestamp())},
        "duration": {"set": True, "infinite": False,
                     "number": max(1, math.ceil(duration_seconds / 60))},
        "flags": [flag.upper() for flag in flags],
        "users": ",".join(users),
    }


def _plain(name: str) -> str:
    """A path segment as it is: node and reservation names never hold / ? # % or spaces."""
    if not name or any(ch in name for ch in "/?#% \t\n"):
        raise SlurmError(f"{name!r} cannot be sent to slurmrestd as a name")
    return name


def _slurm_time(moment: datetime) -> str:
    """Local time without a zone, as slurmdbd reads ``start_time``/``end_time``."""
    local = moment.astimezone() if moment.tzinfo else moment
    return local.strftime("%Y-%m-%dT%H:%M:%S")
