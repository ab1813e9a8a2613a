"""Leader election over a coordination.k8s.io/v1 Lease, as client-go's leaderelection does.

Expiry is judged on this process's monotonic clock, never on the Lease's timestamps (the
replicas' clocks may differ); every write carries the resourceVersion read.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

from adapters.kubernetes.backend import KubernetesBackend, KubernetesConflict, Lease


class LeaseElector:
    """One replica's side of the election:

        elector = LeaseElector(backend, "gpu-runbook-bot", "runbook-bot", identity=pod_name)
        while True:
            if elector.try_acquire():   # create, take over an expired lease, or renew ours
                ...                     # lead until elector.is_leader() turns False
            time.sleep(elector.lease_seconds / 3)

    A lease held by someone else expires when its record has not changed for
    ``leaseDurationSeconds`` since this elector first saw it; a released lease (no holder)
    is free at once. Of two replicas racing for one lease exactly one wins (the other gets
    409 Conflict, re-reads, and sees the winner).
    """

    def __init__(self, backend: KubernetesBackend, name: str, namespace: str, identity: str,
                 lease_seconds: int = 15, *,
                 monotonic: Callable[[], float] = time.monotonic,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        if lease_seconds < 1:
            raise ValueError("lease_seconds must be at least 1")
        self.backend = backend
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.lease_seconds = lease_seconds
        self._monotonic = monotonic
        self._now = now
        self._observed: tuple[str | None, str | None, str] | None = None  # holder, renew, rv
        self._observed_at = 0.0
        self._leading_until = 0.0

    def is_leader(self) -> bool:
        """True while our last successful acquire/renew is younger than the lease."""
        return self._monotonic() < self._leading_until

    def try_acquire(self) -> bool:
        """One election round: True when we hold the lease after it."""
        for _ in range(3):
            started = self._monotonic()
            lease = self.backend.get_lease(self.namespace, self.name)
            try:
                if lease is None:
                    self._won(self.backend.create_lease(self._ours(None)), started)
                    return True
                self._observe(lease)
                if lease.holder == self.identity:
                    self._won(self.backend.replace_lease(self._ours(lease)), started)
                    return True
                if lease.holder and not self._expired(lease):
                    self._leading_until = 0.0
                    return False
                self._won(self.backend.replace_lease(self._ours(lease)), started)
                return True
            except KubernetesConflict:
                continue  # someone wrote in between: read again and judge anew
        self._leading_until = 0.0
        return False

    def release(self) -> None:
        """Give the lease up (holder cleared) if we hold it, so another replica leads at once."""
        self._leading_until = 0.0
        lease = self.backend.get_lease(self.namespace, self.name)
        if lease is None or lease.holder != self.identity:
            return
        # A 409 means it changed hands meanwhile: nothing of ours to release.
        with contextlib.suppress(KubernetesConflict):
            self.backend.replace_lease(replace(lease, holder=None, duration_seconds=1,
                                               renew_time=self._now()))

    # --- internals ----------------------------------------------------------------

    def _ours(self, lease: Lease | None) -> Lease:
        now = self._now()
        if lease is None:
            return Lease(self.name, self.namespace, self.identity, self.lease_seconds, now, now)
        if lease.holder == self.identity:
            return replace(lease, renew_time=now, duration_seconds=self.lease_seconds)
        return replace(lease, holder=self.identity, duration_seconds=self.lease_seconds,
                       acquire_time=now, renew_time=now, transitions=lease.transitions + 1)

    def _observe(self, lease: Lease) -> None:
        record = (lease.holder, lease.renew_time.isoformat() if lease.renew_time else None,
                  lease.resource_version)
        if record != self._observed:
            self._observed = record
            self._observed_at = self._monotonic()

    def _expired(self, lease: Lease) -> bool:
        duration = lease.duration_seconds or self.lease_seconds
        return self._monotonic() >= self._observed_at + duration

    def _won(self, lease: Lease, started: float) -> None:
        self._observe(lease)
        self._leading_until = started + self.lease_seconds


__all__ = ["LeaseElector"]
