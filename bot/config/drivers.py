"""Configuration of GPU drivers per pool: the pinned version each pool should run, the CUDA
versions its workloads use, and NVIDIA's table of the lowest driver each CUDA version needs
(docs/configuration.md, "Drivers"). upgrade-driver and drift-report read it.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kit.versions import version_key as numeric_version

Pool = Literal["slurm", "kubernetes"]
DRIVER_VERSION = re.compile(r"^[0-9]{1,4}(\.[0-9]{1,4}){1,3}$")
CUDA_VERSION = re.compile(r"^[0-9]{1,2}\.[0-9]{1,2}$")

# The lowest Linux x86_64 driver of each CUDA toolkit release (NVIDIA's CUDA Toolkit release
# notes, table 3 "CUDA Toolkit and Corresponding Driver Versions", the GA release of each
# minor version). CUDA's minor version compatibility lets older 12.x drivers (>= 525.60.13)
# run some 12.x applications with limits (no PTX JIT of newer code): a site that relies on it
# lowers its rows in `drivers.cuda_minimum`.
DEFAULT_CUDA_MINIMUM: dict[str, str] = {
    "11.7": "515.43.04",
    "11.8": "520.61.05",
    "12.0": "525.60.13",
    "12.1": "530.30.02",
    "12.2": "535.54.03",
    "12.3": "545.23.06",
    "12.4": "550.54.14",
    "12.5": "555.42.02",
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
}


def version_key(version: str) -> tuple[int, ...]:
    """A checked driver version as numbers (the configuration's versions are checked when
    it loads, parameters by their type)."""
    return numeric_version(version) or ()


class PoolDriver(BaseModel):
    """One pool's drivers: the version pinned for it (drift-report flags a node that runs
    another) and the CUDA versions its workloads use (upgrade-driver refuses a driver below
    what the newest of them needs)."""

    model_config = ConfigDict(extra="forbid")
    pinned: str | None = None
    cuda: list[str] = Field(default_factory=list)

    @field_validator("pinned")
    @classmethod
    def _pinned(cls, value: str | None) -> str | None:
        if value is not None and not DRIVER_VERSION.fullmatch(value):
            raise ValueError(f'"{value}" is not a driver version like 550.54.15')
        return value

    @field_validator("cuda")
    @classmethod
    def _cuda(cls, value: list[str]) -> list[str]:
        for item in value:
            if not CUDA_VERSION.fullmatch(item):
                raise ValueError(f'"{item}" is not a CUDA version like 12.4')
        return value


class DriversConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pools: dict[Pool, PoolDriver] = Field(default_factory=dict)
    # CUDA version -> lowest driver; rows given here replace the default's rows one by one
    cuda_minimum: dict[str, str] = Field(default_factory=dict)

    @field_validator("cuda_minimum")
    @classmethod
    def _table(cls, value: dict[str, str]) -> dict[str, str]:
        for cuda, driver in value.items():
            if not CUDA_VERSION.fullmatch(cuda) or not DRIVER_VERSION.fullmatch(driver):
                raise ValueError(f"{cuda}: {driver} is not CUDA version: driver version "
                                 "(12.4: 550.54.14)")
        return value

    def cuda_table(self) -> dict[str, str]:
        return {**DEFAULT_CUDA_MINIMUM, **self.cuda_minimum}

    def pool(self, pool: str) -> PoolDriver:
        return next((entry for name, entry in self.pools.items() if name == pool), PoolDriver())

    def floor(self, pool: str) -> tuple[str, str] | None:
        """The lowest driver ``pool``'s CUDA versions allow, with the CUDA version that asks
        for it; None when the pool names no CUDA version. A CUDA version the table lacks is a
        configuration error, found at load (``_known_cuda``)."""
        table = self.cuda_table()
        needs = [(table[cuda], cuda) for cuda in self.pool(pool).cuda]
        return max(needs, key=lambda need: version_key(need[0])) if needs else None

    def floors(self) -> dict[str, tuple[str, str]]:
        return {pool: floor for pool in ("slurm", "kubernetes")
                if (floor := self.floor(pool)) is not None}

    def template_facts(self) -> dict[str, dict[str, str | None]]:
        """``drivers`` in runbook templates: per pool its pinned driver and its floor with
        the CUDA version that asks for it (None where the configuration says nothing)."""
        facts: dict[str, dict[str, str | None]] = {}
        for pool in ("slurm", "kubernetes"):
            floor = self.floor(pool)
            facts[pool] = {"pinned": self.pool(pool).pinned, "floor": floor[0] if floor else None,
                           "cuda": floor[1] if floor else None}
        return facts

    @model_validator(mode="after")
    def _known_cuda(self) -> DriversConfig:
        table = self.cuda_table()
        for name, pool in self.pools.items():
            unknown = [cuda for cuda in pool.cuda if cuda not in table]
            if unknown:
                raise ValueError(f"drivers.pools.{name}.cuda: {', '.join(unknown)} not in the "
                                 f"CUDA table (known: {', '.join(sorted(table, key=version_key))}"
                                 "; add it under drivers.cuda_minimum)")
            floor = self.floor(name)
            if pool.pinned and floor and version_key(pool.pinned) < version_key(floor[0]):
                raise ValueError(f"drivers.pools.{name}.pinned {pool.pinned} is below "
                                 f"{floor[0]}, which CUDA {floor[1]} needs")
        return self


def below_floor(version: str, floor: tuple[str, str] | None) -> str | None:
    """Why driver ``version`` cannot serve a pool with ``floor``, or None when it can."""
    if floor is None or version_key(version) >= version_key(floor[0]):
        return None
    return (f"driver {version} is below {floor[0]}, the lowest driver for CUDA {floor[1]} "
            "which the pool's workloads use (drivers.pools.POOL.cuda)")
