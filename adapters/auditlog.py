"""What a destination of the bot's audit log receives: events as the log stores them
(``Event``), what its client answers when it took a batch (``Accepted``) or raises when a
batch was not delivered (``DeliveryError``) or cannot be sent as configured
(``DestinationSetupError``). Nothing here sends."""

from __future__ import annotations

from dataclasses import dataclass

from kit.canonical import canonical


@dataclass(frozen=True)
class Event:
    """One audit event, as stored: ``data`` is its canonical JSON text."""

    seq: int
    ts: str  # UTC ISO-8601, e.g. 2026-01-02T03:04:05.123456Z
    execution_id: int | None
    kind: str
    actor: str
    data: str
    prev_hash: str
    hash: str

    def as_json(self) -> str:
        """The event as one canonical JSON object (keys sorted, ``data`` as an object): the
        line ``runbook audit export --format jsonl`` writes for it."""
        return ('{"actor":' + canonical(self.actor) + ',"data":' + self.data
                + ',"execution_id":' + canonical(self.execution_id)
                + ',"hash":' + canonical(self.hash) + ',"kind":' + canonical(self.kind)
                + ',"prev_hash":' + canonical(self.prev_hash) + ',"seq":' + str(self.seq)
                + ',"ts":' + canonical(self.ts) + "}")


@dataclass(frozen=True)
class Accepted:
    """A batch the receiver took. ``rejected``: records it said it dropped all the same
    (OTLP partial success: sending them again would not change its mind), and why."""

    rejected: int = 0
    note: str = ""


class DeliveryError(Exception):
    """A batch was not (or not surely) delivered: it is to be sent again, whole.

    ``retryable=False``: the receiver refused it and would refuse it again as it is (its
    configuration must change); ``retry_after``: seconds the receiver asked to wait."""

    def __init__(self, message: str, *, retryable: bool = True,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after


class DestinationSetupError(Exception):
    """A destination cannot be used as configured (a certificate, a headers file)."""
