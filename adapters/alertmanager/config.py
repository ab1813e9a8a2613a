"""The ``alertmanager:`` section of the bot configuration."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

_URL = re.compile(r"^https?://[^\s/]+(/\S*)?$")


class AlertmanagerConfig(BaseModel):
    """Where Alertmanager answers. ``timeout`` bounds each HTTP request, in seconds;
    ``headers`` go with every request (e.g. ``Authorization`` for a proxy)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str  # e.g. http://alertmanager:9093
    timeout: float = Field(default=10.0, gt=0)
    headers: dict[str, str] | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not _URL.match(value):
            raise ValueError(f"{value!r} is not a URL like http://alertmanager:9093")
        return value.rstrip("/")
