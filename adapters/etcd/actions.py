"""The ``etcd.*`` actions: snapshot_save, snapshot_status, snapshot_restore, health,
key_count and keys_present; ``plan()`` shows the etcdctl (or etcdutl) line that runs.

A restore never writes into a data directory that holds anything but the same snapshot.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import ClassVar

from pydantic import Field, field_validator

from adapters.actions import (
    ActionBase,
    ActionContext,
    ActionError,
    ActionResult,
    ActionTimeout,
    ConnectingActionSet,
    StrictArguments,
)
from adapters.etcd.backend import EtcdBackend, EtcdCommands, EtcdctlBackend, EtcdError, sha256_of
from adapters.etcd.config import EtcdConfig
from adapters.host import confined
from kit.durations import format_duration


def _absolute(value: str) -> str:
    if any(ord(c) < 32 for c in value):
        raise ValueError("must be one line without control characters")
    if not Path(value).is_absolute():
        raise ValueError(f"{value!r} must be an absolute path")
    return value


def _key(value: str) -> str:
    if "\x00" in value or "\n" in value:
        raise ValueError("an etcd key here must be one line without NUL characters")
    return value


class SnapshotSaveArguments(StrictArguments):
    path: str = Field(min_length=1, description="absolute path of the snapshot file to write")

    _path = field_validator("path")(_absolute)


class SnapshotStatusArguments(StrictArguments):
    path: str = Field(min_length=1, description="absolute path of a snapshot file")

    _path = field_validator("path")(_absolute)


class SnapshotRestoreArguments(StrictArguments):
    snapshot: str = Field(min_length=1, description="absolute path of the snapshot to restore")
    data_dir: str = Field(min_length=1, description="a new data directory (absent or empty)")

    _paths = field_validator("snapshot", "data_dir")(_absolute)


class HealthArguments(StrictArguments):
    wait: float = Field(default=0, ge=0, le=3600,
                        description="seconds to keep polling until every endpoint is healthy")


class KeyCountArguments(StrictArguments):
    prefix: str = Field(default="", description='key prefix; "" counts every key')
    at_least: int | None = Field(default=None, ge=0, description="fail when fewer keys")

    _prefix = field_validator("prefix")(_key)


class KeysPresentArguments(StrictArguments):
    keys: list[str] = Field(min_length=1, max_length=1000)
    values: dict[str, str] = Field(default_factory=dict,
                                   description="expected values (their keys must exist too)")

    @field_validator("keys")
    @classmethod
    def _keys(cls, value: list[str]) -> list[str]:
        for key in value:
            if not key:
                raise ValueError("keys must not be empty")
            _key(key)
        return value

    def wanted(self) -> list[str]:
        return list(dict.fromkeys([*self.keys, *self.values]))


class _EtcdAction(ActionBase[EtcdBackend, EtcdConfig]):
    @functools.cached_property
    def commands(self) -> EtcdCommands:
        return EtcdCommands(self.config)

    def _timeout(self, ctx: ActionContext) -> float:
        remaining = ctx.remaining()
        if remaining <= 0:
            raise ActionTimeout(f"{ctx.step_id}: no time left for {self.name}")
        return remaining


class SnapshotSaveAction(_EtcdAction):
    """A fresh snapshot, written through a ``.partial`` file (an older one is replaced)."""

    name: ClassVar[str] = "etcd.snapshot_save"
    Arguments: ClassVar[type[StrictArguments]] = SnapshotSaveArguments

    def _target(self, args: SnapshotSaveArguments) -> Path:
        return confined(args.path, self.config.backup_dir, "etcd.backup_dir")

    def plan(self, args: SnapshotSaveArguments) -> list[str]:
        line = self.commands.shown(self.commands.snapshot_save(str(self._target(args))))
        if len(self.config.endpoints) > 1:
            line += f"  # from the first healthy of {', '.join(self.config.endpoints)}"
        return [line]

    def run(self, args: SnapshotSaveArguments, ctx: ActionContext) -> ActionResult:
        path = self._target(args)
        replaced = path.exists()
        try:
            endpoint = self.backend.snapshot_save(path, timeout=self._timeout(ctx))
            status = self.backend.snapshot_status(path, timeout=self._timeout(ctx))
        except (EtcdError, OSError) as exc:
            raise ActionError(f"etcd snapshot to {path} failed: {exc}") from exc
        return ActionResult(
            summary=(f"saved etcd snapshot {path} from {endpoint}: revision {status.revision}, "
                     f"{status.total_keys} keys, {status.total_size} bytes"
                     + (" (replaced an older file)" if replaced else "")),
            details={**status.as_dict(), "endpoint": endpoint, "replaced": replaced},
        )


class SnapshotStatusAction(_EtcdAction):
    name: ClassVar[str] = "etcd.snapshot_status"
    Arguments: ClassVar[type[StrictArguments]] = SnapshotStatusArguments

    def plan(self, args: SnapshotStatusArguments) -> list[str]:
        return [self.commands.shown(self.commands.snapshot_status(args.path))]

    def run(self, args: SnapshotStatusArguments, ctx: ActionContext) -> ActionResult:
        try:
            status = self.backend.snapshot_status(Path(args.path), timeout=self._timeout(ctx))
        except (EtcdError, OSError) as exc:
            raise ActionError(f"cannot read etcd snapshot {args.path}: {exc}") from exc
        return ActionResult(
            summary=(f"snapshot {args.path}: revision {status.revision}, {status.total_keys} "
                     f"keys, hash {status.hash}"),
            details=status.as_dict(), changed=False)


class SnapshotRestoreAction(_EtcdAction):
    """Restore into a new data directory. Into one already restored from the same snapshot
    (same sha256, recorded there) it changes nothing; into any other non-empty one it is
    refused."""

    name: ClassVar[str] = "etcd.snapshot_restore"
    Arguments: ClassVar[type[StrictArguments]] = SnapshotRestoreArguments

    def plan(self, args: SnapshotRestoreArguments) -> list[str]:
        try:
            argv = self.commands.snapshot_restore(args.snapshot, args.data_dir)
        except (EtcdError, OSError) as exc:
            raise ActionError(str(exc)) from exc
        return [self.commands.shown(argv)]

    def run(self, args: SnapshotRestoreArguments, ctx: ActionContext) -> ActionResult:
        snapshot, data_dir = Path(args.snapshot), Path(args.data_dir)
        if not snapshot.is_file():
            raise ActionError(f"snapshot {snapshot} does not exist: nothing was restored")
        marker = self.backend.restored_from(data_dir)
        if marker is not None:
            digest = sha256_of(snapshot)
            if marker.get("sha256") == digest:
                return ActionResult(
                    summary=f"{data_dir} already holds snapshot {snapshot} (restored "
                            f"{marker.get('restored_at', '?')})",
                    details={"snapshot": str(snapshot), "data_dir": str(data_dir),
                             "sha256": digest, "revision": marker.get("revision")},
                    changed=False)
            raise ActionError(
                f"{data_dir} was restored from another snapshot ({marker.get('snapshot')}, "
                f"sha256 {str(marker.get('sha256'))[:12]}): choose a new data directory; "
                "nothing was changed")
        try:
            status = self.backend.snapshot_restore(snapshot, data_dir,
                                                   timeout=self._timeout(ctx))
        except (EtcdError, OSError) as exc:
            raise ActionError(f"restoring {snapshot} into {data_dir} failed: {exc}") from exc
        return ActionResult(
            summary=(f"restored {snapshot} (revision {status.revision}, {status.total_keys} "
                     f"keys) into {data_dir} as member {self.config.name}; start etcd on it"),
            details={**status.as_dict(), "snapshot": str(snapshot), "data_dir": str(data_dir),
                     "name": self.config.name})


class HealthAction(_EtcdAction):
    """Every endpoint healthy, else ActionError: health, key_count, keys_present and
    snapshot_status only read, and serve as checks after a restore."""

    name: ClassVar[str] = "etcd.health"
    Arguments: ClassVar[type[StrictArguments]] = HealthArguments

    def plan(self, args: HealthArguments) -> list[str]:
        line = self.commands.shown(self.commands.health())
        if args.wait:
            line += f"  # until every endpoint is healthy, at most {format_duration(args.wait)}"
        return [line]

    def run(self, args: HealthArguments, ctx: ActionContext) -> ActionResult:
        deadline = time.monotonic() + min(args.wait, ctx.remaining())
        while True:
            try:
                health = self.backend.health(timeout=self._timeout(ctx))
            except (EtcdError, OSError) as exc:
                raise ActionError(f"etcd health check failed: {exc}") from exc
            details = {"endpoints": {e: {"healthy": h.healthy, "error": h.error, "took": h.took}
                                     for e, h in health.items()}}
            sick = [h for h in health.values() if not h.healthy]
            if not sick:
                return ActionResult(summary=f"etcd: {len(health)} endpoint(s) healthy",
                                    details=details, changed=False)
            if time.monotonic() >= deadline:
                problems = "; ".join(f"{h.endpoint}: {h.error}" for h in sick)
                raise ActionError(f"etcd: {len(sick)} of {len(health)} endpoint(s) unhealthy"
                                  + (f" after {format_duration(args.wait)}" if args.wait else "")
                                  + f": {problems}")
            ctx.checkpoint(f"waiting for {len(sick)} etcd endpoint(s) to be healthy")
            self._sleep(max(0.05, ctx.pause(0.5)))


class KeyCountAction(_EtcdAction):
    name: ClassVar[str] = "etcd.key_count"
    Arguments: ClassVar[type[StrictArguments]] = KeyCountArguments

    def plan(self, args: KeyCountArguments) -> list[str]:
        return [self.commands.shown(self.commands.count(args.prefix))]

    def run(self, args: KeyCountArguments, ctx: ActionContext) -> ActionResult:
        try:
            count = self.backend.key_count(args.prefix, timeout=self._timeout(ctx))
        except (EtcdError, OSError) as exc:
            raise ActionError(f"counting etcd keys failed: {exc}") from exc
        where = f"under {args.prefix!r}" if args.prefix else "in total"
        if args.at_least is not None and count < args.at_least:
            raise ActionError(f"etcd holds {count} keys {where}, expected at least "
                              f"{args.at_least}")
        return ActionResult(summary=f"etcd holds {count} keys {where}",
                            details={"prefix": args.prefix, "count": count}, changed=False)


class KeysPresentAction(_EtcdAction):
    name: ClassVar[str] = "etcd.keys_present"
    Arguments: ClassVar[type[StrictArguments]] = KeysPresentArguments

    def plan(self, args: KeysPresentArguments) -> list[str]:
        return [self.commands.shown(self.commands.get(key)) for key in args.wanted()]

    def run(self, args: KeysPresentArguments, ctx: ActionContext) -> ActionResult:
        present, missing, mismatched = [], [], {}
        for key in args.wanted():
            try:
                value = self.backend.get(key, timeout=self._timeout(ctx))
            except (EtcdError, OSError) as exc:
                raise ActionError(f"reading etcd key {key} failed: {exc}") from exc
            if value is None:
                missing.append(key)
                continue
            present.append(key)
            if key in args.values and value != args.values[key]:
                mismatched[key] = {"expected": args.values[key], "actual": value}
        details = {"present": present, "missing": missing, "mismatched": mismatched}
        if missing or mismatched:
            parts = []
            if missing:
                parts.append(f"missing {', '.join(missing)}")
            if mismatched:
                parts.append("unexpected values for " + ", ".join(
                    f"{k} ({v['actual']!r}, expected {v['expected']!r})"
                    for k, v in mismatched.items()))
            raise ActionError(f"etcd keys not as expected: {'; '.join(parts)}")
        return ActionResult(summary=f"etcd: all {len(present)} key(s) present",
                            details=details, changed=False)


ACTION_CLASSES: tuple[type[_EtcdAction], ...] = (
    SnapshotSaveAction, SnapshotStatusAction, SnapshotRestoreAction, HealthAction,
    KeyCountAction, KeysPresentAction,
)


class EtcdActions(ConnectingActionSet[EtcdBackend, EtcdConfig]):
    """Every ``etcd.*`` action over one backend: ``EtcdActions(config).all()``."""

    action_classes = ACTION_CLASSES
    backend_class = EtcdctlBackend


__all__ = [
    "ACTION_CLASSES", "EtcdActions", "HealthAction", "KeyCountAction", "KeysPresentAction",
    "SnapshotRestoreAction", "SnapshotSaveAction", "SnapshotStatusAction",
]
