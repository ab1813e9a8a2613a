"""Runbook files that passed every check, remembered between runs (a small JSON file in the
bot's state folder), so a command does not check templates and actions again at each start.

A key is the sha256 of a file's exact text with the bot's version, a mark of the code that
checks it and what else the check took: a changed file has another key and is always checked
again. The file only ever skips checks a key says passed; unreadable, corrupt or of another
shape, it is ignored. A runbook's text itself is never taken from it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import tempfile
from collections.abc import Iterable
from functools import cache
from pathlib import Path

FORMAT = 1
LIMIT = 1024  # keys kept: the newest (a key is 64 characters; the file is read at each start)
FILE_NAME = "runbook-checks.json"
_CODE = ("bot/runbooks", "adapters", "kit")  # what checks a runbook (the schema, the actions)
_LIBRARIES = ("pydantic", "pydantic_core", "jinja2", "yaml")


class Checked:
    """The keys of the files that passed; ``save`` writes them back when some were added."""

    def __init__(self, path: Path | None, keys: Iterable[str] = ()) -> None:
        self.path = path
        self._keys = dict.fromkeys(keys)
        self._added = False

    @classmethod
    def read(cls, path: Path) -> Checked:
        """The keys in ``path``; none when it is missing, unreadable or not this format."""
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError, UnicodeDecodeError):
            return cls(path)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return cls(path)
        keys = data.get("passed")
        if not isinstance(keys, list) or not all(
                isinstance(key, str) and len(key) == 64 for key in keys):
            return cls(path)
        return cls(path, keys)

    def key(self, source: str, context: str) -> str:
        """The key of a file's text checked in ``context`` (the actions it may name, the host
        commands it is checked against)."""
        made = json.dumps([FORMAT, code_mark(), context, source])
        return hashlib.sha256(made.encode()).hexdigest()

    def __contains__(self, key: str) -> bool:
        return key in self._keys

    def add(self, key: str) -> None:
        if key not in self._keys:
            self._keys[key] = None
            self._added = True

    def save(self) -> None:
        """Write the keys (the newest LIMIT) in one replace; a failure is only a slower
        next start, so it is ignored."""
        if not self._added or self.path is None:
            return
        keys = list(self._keys)[-LIMIT:]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".checks-")
            with os.fdopen(handle, "w") as out:
                json.dump({"format": FORMAT, "passed": keys}, out)
            os.replace(temporary, self.path)
        except OSError:
            return
        self._added = False


@cache
def code_mark() -> str:
    """The bot's version, and the size and time of the libraries that read a runbook and of
    every module that checks one: a new release, an upgraded library or an edited checker
    makes every key new. Read without importing anything (a start stays quick)."""
    import bot

    made = hashlib.sha256(f"gpu-runbook-bot={bot.__version__};".encode())
    for library in _LIBRARIES:
        spec = importlib.util.find_spec(library)
        origin = spec.origin if spec is not None else None
        found = os.stat(origin) if origin else None
        made.update(f"{library}:{found.st_size}:{found.st_mtime_ns};".encode() if found
                    else f"{library}:?;".encode())
    root = Path(__file__).resolve().parent.parent.parent
    for top in _CODE:
        for folder, subfolders, files in os.walk(root / top):
            subfolders[:] = sorted(name for name in subfolders if name != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    found = os.stat(os.path.join(folder, name))
                    made.update(f"{folder}/{name}:{found.st_size}:{found.st_mtime_ns};".encode())
    return made.hexdigest()


def beside(database_url: str) -> Path:
    """Where the cache lives: beside a SQLite database, else in the bot's state folder."""
    if database_url.startswith(("sqlite:///", "sqlite+pysqlite:///")):
        database = database_url.split(":///", 1)[1].split("?", 1)[0]
        if database and database != ":memory:":
            return Path(database).parent / FILE_NAME
    state = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state"))
    return state / "gpu-runbook-bot" / FILE_NAME
