"""What upgrade-slurm reads of Slurm's daemons: versions, slurmd start times, the state save
directory; as a Protocol with its implementation over the Slurm client programs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from adapters.slurm import parsing
from adapters.slurm.backend import SlurmError
from adapters.slurm.config import SlurmConfig
from adapters.slurm.transports.cli import CliBackend
from kit.hostlist import compress

_SETTING = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")


@dataclass(frozen=True)
class NodeDaemon:
    """One node's slurmd as slurmctld sees it (``scontrol show node``)."""

    name: str
    version: str  # "" until the slurmd registered
    started: str  # SlurmdStartTime
    responding: bool


class DaemonReads(Protocol):
    def controller(self) -> dict[str, str]:
        """``scontrol show config`` as key -> value (SLURM_VERSION, StateSaveLocation...)."""
        ...

    def dbd_version(self) -> str:
        """slurmdbd's own version (``sacctmgr show configuration`` SLURMDBD_VERSION)."""
        ...

    def node_daemons(self, names: list[str] | None = None) -> list[NodeDaemon]:
        """Each node's slurmd (every node when None); unknown names are absent."""
        ...


def settings(text: str) -> dict[str, str]:
    """``Key = value`` lines (scontrol show config, sacctmgr show configuration)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        match = _SETTING.match(line)
        if match:
            found.setdefault(match.group(1), match.group(2))
    return found


def node_daemons_from(text: str) -> list[NodeDaemon]:
    """``scontrol show node -o`` lines -> NodeDaemon (``State=IDLE*``: not responding)."""
    daemons = []
    for info, line in zip(parsing.parse_node_text(text),
                          [x for x in text.splitlines() if x.startswith("NodeName=")],
                          strict=True):
        fields = parsing.key_values(line)
        version = fields.get("Version", "")
        daemons.append(NodeDaemon(info.name, "" if version == "(null)" else version,
                                  fields.get("SlurmdStartTime", ""),
                                  info.responding and "DOWN" not in info.state.upper()))
    return daemons


class CliDaemonReads:
    """``DaemonReads`` over scontrol and sacctmgr (whatever ``slurm.backend`` reads nodes with)."""

    def __init__(self, config: SlurmConfig, cli: CliBackend | None = None) -> None:
        self._cli = cli or CliBackend(config)

    def controller(self) -> dict[str, str]:
        return settings(self._cli.run(["scontrol", "show", "config"]).stdout)

    def dbd_version(self) -> str:
        argv = ["sacctmgr", "show", "configuration"]
        found = settings(self._cli.run(argv).stdout).get("SLURMDBD_VERSION", "")
        if not found:
            raise SlurmError("slurmdbd did not say its version (no SLURMDBD_VERSION)", argv)
        return found

    def node_daemons(self, names: list[str] | None = None) -> list[NodeDaemon]:
        argv = ["scontrol", "show", "node", "-o"]
        if names is not None:
            if not names:
                return []
            argv.append(compress(names))
        done = self._cli.run(argv, check=names is None)
        if done.returncode != 0 and "NodeName=" not in done.stdout:
            raise SlurmError(f"{' '.join(argv)} failed (exit {done.returncode})", argv,
                             done.stderr)
        return node_daemons_from(done.stdout)
