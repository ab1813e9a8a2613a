"""The fake workspace: team, app and bot, people, channels, user groups, and what was posted.

Objects are shaped like the Web API's (conversations.info, users.info, ...). Messages are kept
per channel, top-level messages in posting order with their thread replies; ephemeral messages
and replies whose thread_ts names no message are kept apart (Slack does not show them in the
channel history either).
"""
from __future__ import annotations

import copy
import threading
import time
from typing import Any

Obj = dict[str, Any]

TEAM_ID = "T0LAB"
TEAM_NAME = "GPU Runbook Lab"
TEAM_DOMAIN = "grblab"
TEAM_URL = f"https://{TEAM_DOMAIN}.slack.com/"
APP_ID = "A0LAB"
BOT_ID = "B0BOT"
BOT_USER = "U0BOT"
BOT_NAME = "runbook-bot"
SEEDED_AT = 1700000000  # creation time of every seeded object
BLOCKS_ONLY_TEXT = "This content can't be displayed."  # Slack's text for a blocks-only post
MAX_TEXT = 40000  # Slack truncates longer message text

# id: (name, real name); email is name@grblab.example
PEOPLE: dict[str, tuple[str, str]] = {
    "U0ALICE": ("alice", "Alice Archer"),
    "U0BOB": ("bob", "Bob Baker"),
    "U0CAROL": ("carol", "Carol Chen"),
    "U0DAVE": ("dave", "Dave Dietrich"),
}
CHANNEL = "C0RUNBOOK"
CHANNELS: dict[str, Obj] = {
    CHANNEL: {"name": "gpu-ops", "members": [BOT_USER, *PEOPLE],
              "topic": "GPU cluster operations: runbooks, approvals, alerts",
              "purpose": "Where the runbook bot asks, reports and is approved"},
    # The bot is not a member here: posting answers not_in_channel, as in Slack.
    "C0GENERAL": {"name": "general", "members": list(PEOPLE), "is_general": True,
                  "topic": "", "purpose": "Company-wide announcements"},
}
USERGROUPS: dict[str, Obj] = {
    "S0GPULEADS": {"handle": "gpu-leads", "name": "GPU leads",
                   "description": "Approve disruptive runbooks", "users": ["U0CAROL", "U0DAVE"]},
    "S0ONCALL": {"handle": "oncall", "name": "On-call",
                 "description": "Requests runbooks", "users": ["U0ALICE", "U0BOB"]},
}
ICONS = {f"image_{n}": f"https://a.slack-edge.com/80588/img/plugins/app/bot_{n}.png"
         for n in (36, 48, 72)}
BOT_PROFILE: Obj = {"id": BOT_ID, "deleted": False, "name": BOT_NAME, "updated": SEEDED_AT,
                    "app_id": APP_ID, "icons": ICONS, "team_id": TEAM_ID}
# Lab-only keys of a stored message; everything else is what the Web API answers.
LAB_KEYS = ("channel", "replies", "deleted", "updates", "posted_at", "via", "orphan")


def dm_id(user: str) -> str:
    """The bot's direct-message conversation with a person: U0ALICE -> D0ALICE."""
    return "D" + user[1:]


def channel_object(cid: str, include_num_members: bool = False) -> Obj:
    seed = CHANNELS[cid]
    obj: Obj = {
        "id": cid, "name": seed["name"], "is_channel": True, "is_group": False,
        "is_im": False, "is_mpim": False, "is_private": False, "created": SEEDED_AT,
        "is_archived": False, "is_general": bool(seed.get("is_general")), "unlinked": 0,
        "name_normalized": seed["name"], "is_shared": False, "is_org_shared": False,
        "is_pending_ext_shared": False, "pending_shared": [], "context_team_id": TEAM_ID,
        "updated": SEEDED_AT * 1000, "parent_conversation": None, "creator": "U0CAROL",
        "is_ext_shared": False, "shared_team_ids": [TEAM_ID], "pending_connected_team_ids": [],
        "is_member": BOT_USER in seed["members"],
        "topic": {"value": seed["topic"], "creator": "U0CAROL" if seed["topic"] else "",
                  "last_set": SEEDED_AT if seed["topic"] else 0},
        "purpose": {"value": seed["purpose"], "creator": "U0CAROL", "last_set": SEEDED_AT},
        "previous_names": [],
    }
    if include_num_members:
        obj["num_members"] = len(seed["members"])
    return obj


def im_object(cid: str) -> Obj:
    return {"id": cid, "created": SEEDED_AT, "is_archived": False, "is_im": True,
            "is_org_shared": False, "context_team_id": TEAM_ID, "updated": SEEDED_AT * 1000,
            "user": "U" + cid[1:], "is_user_deleted": False, "priority": 0}


def user_object(uid: str) -> Obj:
    if uid == BOT_USER:
        name, real = BOT_NAME, BOT_NAME
    else:
        name, real = PEOPLE[uid]
    profile: Obj = {
        "title": "", "phone": "", "skype": "", "real_name": real, "real_name_normalized": real,
        "display_name": name, "display_name_normalized": name, "fields": None,
        "status_text": "", "status_emoji": "", "status_expiration": 0,
        "avatar_hash": "g" + uid[2:].lower()[:11], "first_name": real.split()[0],
        "last_name": real.split()[-1] if " " in real else "", "team": TEAM_ID, **ICONS,
    }
    if uid == BOT_USER:
        profile.update(bot_id=BOT_ID, api_app_id=APP_ID, always_active=True)
    else:
        profile["email"] = f"{name}@{TEAM_DOMAIN}.example"
    return {
        "id": uid, "team_id": TEAM_ID, "name": name, "deleted": False, "color": "9f69e7",
        "real_name": real, "tz": "Europe/Berlin", "tz_label": "Central European Time",
        "tz_offset": 3600, "profile": profile, "is_admin": uid == "U0CAROL",
        "is_owner": False, "is_primary_owner": False, "is_restricted": False,
        "is_ultra_restricted": False, "is_bot": uid == BOT_USER, "is_app_user": False,
        "updated": SEEDED_AT, "is_email_confirmed": uid != BOT_USER,
        "who_can_share_contact_card": "EVERYONE",
    }


def usergroup_object(sid: str, include_users: bool, include_count: bool) -> Obj:
    seed = USERGROUPS[sid]
    obj: Obj = {
        "id": sid, "team_id": TEAM_ID, "is_usergroup": True, "is_subteam": True,
        "name": seed["name"], "description": seed["description"], "handle": seed["handle"],
        "is_external": False, "date_create": SEEDED_AT, "date_update": SEEDED_AT,
        "date_delete": 0, "auto_type": None, "auto_provision": False,
        "enterprise_subteam_id": "", "created_by": "U0CAROL", "updated_by": "U0CAROL",
        "deleted_by": None, "prefs": {"channels": [], "groups": []},
    }
    if include_users:
        obj["users"] = list(seed["users"])
    if include_count:
        obj["user_count"] = len(seed["users"])
    return obj


def api_message(m: Obj) -> Obj:
    """A stored message as the Web API shows it (without the lab's bookkeeping)."""
    out = {k: copy.deepcopy(v) for k, v in m.items() if k not in LAB_KEYS}
    replies = [r for r in m.get("replies", []) if not r.get("deleted")]
    if replies:
        users = sorted({r["user"] for r in replies})
        out.update(thread_ts=m["ts"], reply_count=len(replies), reply_users_count=len(users),
                   latest_reply=replies[-1]["ts"], reply_users=users, is_locked=False,
                   subscribed=False)
    return out


class Workspace:
    """Channels and their messages; every method holds the lock."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.clock = 0  # last ts handed out, in microseconds
        self.messages: dict[str, list[Obj]] = {}
        self.ephemeral: dict[str, list[Obj]] = {}
        self.orphans: dict[str, list[Obj]] = {}

    # --- state ---------------------------------------------------------------

    def dump(self) -> Obj:
        with self.lock:
            return copy.deepcopy({"clock": self.clock, "messages": self.messages,
                                  "ephemeral": self.ephemeral, "orphans": self.orphans})

    def load(self, data: Obj) -> None:
        with self.lock:
            self.clock = int(data.get("clock", 0))
            self.messages = data.get("messages", {})
            self.ephemeral = data.get("ephemeral", {})
            self.orphans = data.get("orphans", {})

    def reset(self) -> None:
        with self.lock:
            self.messages, self.ephemeral, self.orphans = {}, {}, {}

    # --- lookups -------------------------------------------------------------

    def next_ts(self) -> str:
        """Slack's message ts: unix seconds and six digits, unique and increasing."""
        with self.lock:
            self.clock = max(int(time.time() * 1_000_000), self.clock + 1)
            return f"{self.clock // 1_000_000}.{self.clock % 1_000_000:06d}"

    @staticmethod
    def conversation(cid: str) -> Obj | None:
        """The conversation object for an ID, or None (names are not IDs)."""
        if cid in CHANNELS:
            return channel_object(cid)
        if cid.startswith("D") and "U" + cid[1:] in PEOPLE:
            return im_object(cid)
        return None

    @staticmethod
    def resolve(value: str, names: bool, users: bool) -> str | None:
        """A channel argument to a conversation ID: IDs always, `#name`/`name` and user IDs
        (the bot's DM with them) where the method allows them, as chat.postMessage does."""
        if Workspace.conversation(value):
            return value
        if names:
            wanted = value[1:] if value.startswith("#") else value
            for cid, seed in CHANNELS.items():
                if seed["name"] == wanted:
                    return cid
        if users and value in PEOPLE:
            return dm_id(value)
        return None

    @staticmethod
    def members(cid: str) -> list[str]:
        if cid in CHANNELS:
            return list(CHANNELS[cid]["members"])
        return [BOT_USER, "U" + cid[1:]]

    def find(self, cid: str, ts: str) -> tuple[Obj, Obj | None] | None:
        """(message, its thread parent or None) for a live message in a conversation."""
        with self.lock:
            for m in self.messages.get(cid, []):
                if m["ts"] == ts and not m.get("deleted"):
                    return m, None
                for r in m.get("replies", []):
                    if r["ts"] == ts and not r.get("deleted"):
                        return r, m
            for r in self.orphans.get(cid, []):
                if r["ts"] == ts and not r.get("deleted"):
                    return r, None
            return None

    def find_ephemeral(self, cid: str, ts: str) -> Obj | None:
        with self.lock:
            return next((e for e in self.ephemeral.get(cid, []) if e["ts"] == ts), None)

    # --- changes -------------------------------------------------------------

    def post(self, cid: str, content: Obj, thread_ts: str | None = None,
             reply_broadcast: bool = False, via: str = "chat.postMessage") -> Obj:
        """Store a bot message; returns the stored record."""
        with self.lock:
            ts = self.next_ts()
            m: Obj = {"user": BOT_USER, "type": "message", "ts": ts, "bot_id": BOT_ID,
                      "app_id": APP_ID, "text": content.get("text", ""), "team": TEAM_ID,
                      "bot_profile": copy.deepcopy(BOT_PROFILE)}
            for key in ("blocks", "attachments", "metadata"):
                if content.get(key):
                    m[key] = content[key]
            m.update(channel=cid, posted_at=time.time(), via=via, updates=0)
            if thread_ts:
                found = self.find(cid, thread_ts)
                parent = (found[1] or found[0]) if found else None
                if parent is not None and not parent.get("orphan"):
                    m.update(thread_ts=parent["ts"], parent_user_id=parent["user"])
                    if reply_broadcast:
                        m["subtype"] = "thread_broadcast"
                    parent.setdefault("replies", []).append(m)
                    return m
                # Slack accepts a thread_ts that names no message; the reply is then seen
                # nowhere. Kept apart, so a test can tell.
                m.update(thread_ts=thread_ts, orphan=True)
                self.orphans.setdefault(cid, []).append(m)
                return m
            m["replies"] = []
            self.messages.setdefault(cid, []).append(m)
            return m

    def post_ephemeral(self, cid: str, user: str, content: Obj, thread_ts: str | None,
                       via: str = "chat.postEphemeral") -> Obj:
        with self.lock:
            e: Obj = {"type": "message", "subtype": "bot_message", "ts": self.next_ts(),
                      "user": BOT_USER, "bot_id": BOT_ID, "app_id": APP_ID,
                      "to_user": user, "text": content.get("text", ""), "channel": cid,
                      "posted_at": time.time(), "via": via}
            for key in ("blocks", "attachments"):
                if content.get(key):
                    e[key] = content[key]
            if thread_ts:
                e["thread_ts"] = thread_ts
            self.ephemeral.setdefault(cid, []).append(e)
            return e

    def update(self, m: Obj, content: Obj, keep_missing: bool = True) -> Obj:
        """chat.update: given fields replace; blocks/attachments not given are kept (Slack:
        "If you don't include this field, the message's previous blocks will be retained");
        an empty list removes them. keep_missing=False replaces the whole content
        (response_url's replace_original)."""
        with self.lock:
            for key in ("text", "blocks", "attachments", "metadata"):
                if key in content:
                    if content[key] in (None, []) and key != "text":
                        m.pop(key, None)
                    else:
                        m[key] = content[key]
                elif not keep_missing and key != "text":
                    m.pop(key, None)
            m["edited"] = {"user": BOT_USER, "ts": self.next_ts()}
            m["updates"] = m.get("updates", 0) + 1
            return m

    def delete(self, m: Obj) -> None:
        with self.lock:
            m["deleted"] = True

    # --- the lab's view ------------------------------------------------------

    def channel_view(self, cid: str) -> Obj:
        with self.lock:
            seed = CHANNELS.get(cid)
            return copy.deepcopy({
                "channel": cid,
                "name": seed["name"] if seed else None,
                "messages": self.messages.get(cid, []),
                "ephemeral": self.ephemeral.get(cid, []),
                "orphans": self.orphans.get(cid, []),
            })

    def channels_with_content(self) -> list[str]:
        with self.lock:
            found = set(self.messages) | set(self.ephemeral) | set(self.orphans)
            return [c for c in dict.fromkeys([*CHANNELS, *sorted(found)]) if c in found]
