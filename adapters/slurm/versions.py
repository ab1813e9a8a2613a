"""Slurm versions (``22.05.8``: release YY.MM, then a maintenance number) and the upgrade
window: which versions slurmdbd, slurmctld and slurmd may run side by side.

Pure functions: ``window_problems`` says, before anything changes, what an upgrade to a
target would break at any stage of the order slurmdbd -> slurmctld -> slurmd.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from kit.hostlist import compress

# Slurm's major releases, oldest first; after the last, one in May and one in November.
RELEASES = ((14, 3), (14, 11), (15, 8), (16, 5), (17, 2), (17, 11), (18, 8), (19, 5), (20, 2),
            (20, 11), (21, 8), (22, 5), (23, 2), (23, 11), (24, 5), (24, 11), (25, 5), (25, 11))
_VERSION = re.compile(r"^(\d{2})\.(\d{2})(?:\.(\d+))?(?:-[\w.]+)?$")
# From 24.11 Slurm takes RPCs and state from the three releases before; until then, two.
THREE_BEHIND_FROM = (24, 11)


@dataclass(frozen=True, order=True)
class SlurmVersion:
    year: int
    month: int
    micro: int = 0

    @property
    def release(self) -> tuple[int, int]:
        return (self.year, self.month)

    def __str__(self) -> str:
        return f"{self.year:02d}.{self.month:02d}.{self.micro}"


def parse_version(text: str) -> SlurmVersion:
    """``22.05.8``, ``23.11.10``, ``slurm 24.11.1``, ``24.05.0-0rc1``; ValueError otherwise."""
    word = text.strip().split()[-1] if text.strip() else ""
    match = _VERSION.match(word)
    if match is None:
        raise ValueError(f'"{text.strip()[:40]}" is not a Slurm version like 22.05.8')
    version = SlurmVersion(int(match[1]), int(match[2]), int(match[3] or 0))
    release_index(version.release)  # a release Slurm never made is refused
    return version


def release_index(release: tuple[int, int]) -> int:
    """The position of a major release in Slurm's sequence (ValueError for no release)."""
    if release in RELEASES:
        return RELEASES.index(release)
    year, month = release
    last = RELEASES[-1]
    if release > last and month in (5, 11):
        return len(RELEASES) - 1 + (year - last[0]) * 2 - (1 if month == 5 else 0)
    raise ValueError(f"{year:02d}.{month:02d} is not a Slurm major release")


def releases_apart(older: SlurmVersion, newer: SlurmVersion) -> int:
    """How many major releases ``newer`` is ahead of ``older`` (0: the same release)."""
    return release_index(newer.release) - release_index(older.release)


def supported_span(newer: SlurmVersion, override: int | None = None) -> int:
    """How many releases behind ``newer`` Slurm supports: 3 from 24.11, 2 before; or the
    site's ``override`` (slurm.upgrade.max_releases_apart)."""
    if override is not None:
        return override
    return 3 if newer.release >= THREE_BEHIND_FROM else 2


def _group(versions: Mapping[str, SlurmVersion]) -> dict[SlurmVersion, list[str]]:
    grouped: dict[SlurmVersion, list[str]] = {}
    for node, version in sorted(versions.items()):
        grouped.setdefault(version, []).append(node)
    return grouped


def window_problems(target: SlurmVersion, slurmdbd: SlurmVersion, slurmctld: SlurmVersion,
                    slurmd: Mapping[str, SlurmVersion], upgraded: set[str],
                    override: int | None = None) -> list[str]:
    """What an upgrade to ``target`` would break, in people's words (empty: nothing).

    ``slurmd`` holds every node's version, ``upgraded`` the nodes this upgrade reaches.
    Checked: no daemon goes down a version; slurmdbd's database and slurmctld's state are
    converted from at most the supported span back; and after each stage (slurmdbd, then
    slurmctld, then the slurmd) slurmdbd >= slurmctld >= every slurmd, every slurmd within
    the span of slurmctld.
    """
    span = supported_span(target, override)
    problems = [f"{daemon} runs {current}, newer than {target}: this runbook never downgrades"
                for daemon, current in (("slurmdbd", slurmdbd), ("slurmctld", slurmctld))
                if current > target]
    problems += [f"slurmd on {compress(nodes)} runs {current}, newer than {target}: this "
                 "runbook never downgrades" for current, nodes in _group(slurmd).items()
                 if current > target and set(nodes) & upgraded]
    if problems:
        return problems
    for daemon, current in (("slurmdbd", slurmdbd), ("slurmctld", slurmctld)):
        if releases_apart(current, target) > span:
            problems.append(f"{daemon} runs {current}, {releases_apart(current, target)} "
                            f"releases behind {target} (Slurm converts from at most {span}): "
                            "upgrade through an intermediate release first")
    after = {node: target if node in upgraded else version for node, version in slurmd.items()}
    for stage, ctld, nodes in (("after slurmdbd", slurmctld, slurmd),
                               ("after slurmctld", target, slurmd),
                               ("after slurmd", target, after)):
        problems += _stage(stage, target, ctld, nodes, span)
    return list(dict.fromkeys(problems))


def _stage(stage: str, slurmdbd: SlurmVersion, slurmctld: SlurmVersion,
           slurmd: Mapping[str, SlurmVersion], span: int) -> list[str]:
    """slurmdbd >= slurmctld >= every slurmd, each within ``span`` releases of the newer."""
    problems = []
    if slurmctld > slurmdbd or releases_apart(slurmctld, slurmdbd) > span:
        problems.append(f"{stage}: slurmctld {slurmctld} with slurmdbd {slurmdbd} "
                        f"(slurmdbd must be newer, at most {span} releases)")
    for version, nodes in _group(slurmd).items():
        if version > slurmctld:
            problems.append(f"{stage}: slurmd on {compress(nodes)} runs {version}, newer than "
                            f"slurmctld {slurmctld}")
        elif releases_apart(version, slurmctld) > span:
            problems.append(f"{stage}: slurmd on {compress(nodes)} runs {version}, "
                            f"{releases_apart(version, slurmctld)} releases behind slurmctld "
                            f"{slurmctld} (at most {span}): include those nodes, or upgrade "
                            "them first")
    return problems
