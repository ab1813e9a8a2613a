"""What a chat verb answers: text, whether it went well, the execution it concerns."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reply:
    text: str
    ok: bool = True
    execution_id: int | None = None
