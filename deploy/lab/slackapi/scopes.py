"""Scopes, as Slack checks them: a bot-token method whose scope the app was not granted answers
`{"ok": false, "error": "missing_scope", "needed": ..., "provided": ...}` with HTTP 200.

The scopes granted are the shipped app manifest's (deploy/slack-app-manifest.yaml, or
--manifest FILE), so a method the bot starts calling without its scope in the manifest fails
in the lab as it would in a workspace. Read with the standard library: the fake needs no YAML
package, and only `oauth_config.scopes.bot` is read."""
from __future__ import annotations

from pathlib import Path

MANIFEST = Path(__file__).resolve().parents[2] / "slack-app-manifest.yaml"

# method: the scopes any one of which lets a bot token call it (Slack's method pages,
# "Required scopes"); () = no scope needed. Methods absent here need none either.
NEEDED: dict[str, tuple[str, ...]] = {
    "api.test": (),
    "auth.test": (),
    "chat.postMessage": ("chat:write",),
    "chat.update": ("chat:write",),
    "chat.delete": ("chat:write",),
    "chat.postEphemeral": ("chat:write",),
    "chat.getPermalink": (),
    "conversations.info": ("channels:read", "groups:read", "im:read", "mpim:read"),
    "conversations.history": ("channels:history", "groups:history", "im:history",
                              "mpim:history"),
    "conversations.replies": ("channels:history", "groups:history", "im:history",
                              "mpim:history"),
    "users.info": ("users:read",),
    "users.list": ("users:read",),
    "usergroups.list": ("usergroups:read",),
    "usergroups.users.list": ("usergroups:read",),
    "files.getUploadURLExternal": ("files:write",),
    "files.completeUploadExternal": ("files:write",),
}


def bot_scopes(manifest: Path = MANIFEST) -> tuple[str, ...]:
    """The bot scopes a manifest grants (`oauth_config: scopes: bot: [- scope ...]`), in its
    order. Comments and other sections are skipped; a manifest without the list grants none."""
    path: list[tuple[int, str]] = []  # (indent, key) of the mapping keys above this line
    found: list[str] = []
    for raw in manifest.read_text().splitlines():
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        text = line.strip()
        if text.startswith("- "):
            if [k for _, k in path] == ["oauth_config", "scopes", "bot"]:
                found.append(text[2:].strip().strip("'\""))
            continue
        while path and path[-1][0] >= indent:
            path.pop()
        key = text.split(":", 1)[0].strip()
        path.append((indent, key))
    return tuple(found)


def missing(method: str, granted: frozenset[str]) -> dict[str, str] | None:
    """Slack's `needed`/`provided` when none of the method's scopes is granted, else None."""
    needed = NEEDED.get(method, ())
    if not needed or granted.intersection(needed):
        return None
    return {"needed": ",".join(needed), "provided": ",".join(sorted(granted))}
