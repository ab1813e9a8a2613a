"""Canonical JSON: the one encoding the plan hash, the content hash and the audit chain use.

Keys sorted, no spaces, UTF-8 kept as is. Changing it changes every stored hash.
"""

from __future__ import annotations

import json
from typing import Any

_dumps = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode


def canonical(data: Any) -> str:
    """``data`` as canonical JSON text."""
    return _dumps(data)
