"""The environment of every program the bot starts: an allow-list, never the bot's own.

The bot's environment holds its secrets (Slack tokens, the database URL, PGPASSWORD, cloud
keys); no program it starts, and no job step srun starts on a node, may see them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Annotated

from pydantic import AfterValidator

# What a command-line client needs to find its programs, locale, home and configuration
# (TLS trust for etcdctl, SLURM_CONF for every Slurm client). Munge needs no variable:
# slurm.conf names munged's socket. SLURM_JWT stays out: it is a credential, and it would
# switch the Slurm clients from munge to JWT.
KEPT = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "SLURM_CONF",
})
KEPT_PREFIXES = ("LC_",)
# What srun exports to the job step on a node, besides a command's env: names. No TMPDIR:
# the bot host's temporary folder need not exist on the node.
NODE_EXPORT = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def kept(name: str) -> bool:
    """Whether a variable of the bot's own environment reaches the programs it starts."""
    return name in KEPT or name.startswith(KEPT_PREFIXES)


def child_environment(
    extra: Mapping[str, str] | None = None, *, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment for a child: the allow-listed part of ``base`` (default: the bot's
    environment), then ``extra`` (what the adapter or the command's ``env:`` sets)."""
    source = os.environ if base is None else base
    env = {name: value for name, value in source.items() if kept(name)}
    env.update(extra or {})
    return env


def node_export(names: Iterable[str] = ()) -> str:
    """srun's ``--export=`` value: ``NODE_EXPORT`` and then the command's own names (srun
    passes on to the job step only these, plus Slurm's own ``SLURM_*``)."""
    extra = sorted(set(names) - set(NODE_EXPORT))
    return ",".join([*NODE_EXPORT, *extra])


def _check_env(value: dict[str, str]) -> dict[str, str]:
    for name, text in value.items():
        if not ENV_NAME.match(name):
            raise ValueError(f"env: {name!r} is not a variable name (letters, digits, _; "
                             "not starting with a digit)")
        if "\0" in text:
            raise ValueError(f"env: the value of {name} contains a NUL byte")
    return value


# The ``env:`` of a configured command: variables set for it, by name, with their values.
EnvVars = Annotated[dict[str, str], AfterValidator(_check_env)]

__all__ = ["ENV_NAME", "KEPT", "NODE_EXPORT", "EnvVars", "child_environment", "kept",
           "node_export"]
