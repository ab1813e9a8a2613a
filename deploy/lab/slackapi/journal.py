"""What the lab records and arms: Web API calls, faults, Socket Mode envelopes and acks,
response_url registrations and what was posted to them.

Token values are never recorded: a call keeps only the kind of token it carried (bot, app,
invalid, none), and any argument equal to a token is replaced before it is stored.
"""
from __future__ import annotations

import copy
import secrets
import threading
import time
from typing import Any

Obj = dict[str, Any]
MAX_CALLS = 20000  # the oldest calls are dropped beyond this
RESPONSE_URL_USES = 5  # Slack: a response_url works up to 5 times within 30 minutes
RESPONSE_URL_TTL = 1800.0
REDACTED = "[redacted]"


class FaultError(ValueError):
    """A fault specification that does not parse."""


def scrub(value: Any, tokens: set[str]) -> Any:
    """Replace every string equal to a token (or containing one of 8+ characters)."""
    if isinstance(value, str):
        hit = any(t and (t == value or (len(t) >= 8 and t in value)) for t in tokens)
        return REDACTED if hit else value
    if isinstance(value, list):
        return [scrub(v, tokens) for v in value]
    if isinstance(value, dict):
        return {k: scrub(v, tokens) for k, v in value.items()}
    return value


def parse_fault(spec: Obj) -> Obj:
    """{"ratelimit": N, "retry_after": S, "method": M} -> the next N calls (of M) get 429
    with Retry-After: S. Also {"error": CODE, "count": N} (HTTP 200, ok false),
    {"status": 500|503, "count": N} and {"delay": SECONDS, "count": N}."""
    if not isinstance(spec, dict):
        raise FaultError("a fault is a JSON object")
    method = spec.get("method") or None
    if method is not None and not isinstance(method, str):
        raise FaultError("method must be a string")

    def count(key: str, default: int | None = None) -> int:
        value = spec.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise FaultError(f"{key} must be a positive integer")
        return value

    fault: Obj = {"method": method}
    if "ratelimit" in spec:
        retry_after = spec.get("retry_after", 1)
        if isinstance(retry_after, bool) or not isinstance(retry_after, int) or retry_after < 0:
            # slack_sdk's RateLimitErrorRetryHandler does int(Retry-After): whole seconds only.
            raise FaultError("retry_after must be whole seconds (>= 0)")
        fault.update(kind="ratelimit", remaining=count("ratelimit"), retry_after=retry_after)
    elif "error" in spec:
        if not isinstance(spec["error"], str) or not spec["error"]:
            raise FaultError("error must be a Slack error code")
        fault.update(kind="error", error=spec["error"], remaining=count("count", 1))
    elif "status" in spec:
        status = spec["status"]
        if not isinstance(status, int) or not 400 <= status <= 599:
            raise FaultError("status must be an HTTP error status")
        fault.update(kind="status", status=status, remaining=count("count", 1))
    elif "delay" in spec:
        delay = spec["delay"]
        if isinstance(delay, bool) or not isinstance(delay, int | float) or not 0 <= delay <= 600:
            raise FaultError("delay must be seconds between 0 and 600")
        fault.update(kind="delay", delay=float(delay), remaining=count("count", 1))
    else:
        raise FaultError("a fault needs ratelimit, error, status or delay")
    return fault


class Journal:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.calls: list[Obj] = []
        self.call_seq = 0
        self.faults: list[Obj] = []
        self.fault_seq = 0
        self.envelopes: list[Obj] = []
        self.acks: list[Obj] = []
        self.responses: dict[str, Obj] = {}
        self.tickets: dict[str, float] = {}
        self.files: dict[str, Obj] = {}  # uploads by file ID (files.py), bytes as base64

    # --- state ---------------------------------------------------------------

    def dump(self) -> Obj:
        with self.lock:
            return copy.deepcopy({
                "calls": self.calls, "call_seq": self.call_seq, "faults": self.faults,
                "fault_seq": self.fault_seq, "envelopes": self.envelopes, "acks": self.acks,
                "responses": self.responses, "tickets": self.tickets, "files": self.files})

    def load(self, data: Obj) -> None:
        with self.lock:
            self.calls = data.get("calls", [])
            self.call_seq = int(data.get("call_seq", len(self.calls)))
            self.faults = data.get("faults", [])
            self.fault_seq = int(data.get("fault_seq", len(self.faults)))
            self.envelopes = data.get("envelopes", [])
            self.acks = data.get("acks", [])
            self.responses = data.get("responses", {})
            self.tickets = data.get("tickets", {})
            self.files = data.get("files", {})

    def reset(self) -> None:
        with self.lock:
            self.calls, self.faults, self.envelopes, self.acks = [], [], [], []
            self.responses = {}
            self.files = {}

    # --- calls ---------------------------------------------------------------

    def record_call(self, entry: Obj) -> Obj:
        with self.lock:
            self.call_seq += 1
            entry = {"id": self.call_seq, **entry}
            self.calls.append(entry)
            del self.calls[:-MAX_CALLS]
            return entry

    def list_calls(self, method: str | None = None) -> list[Obj]:
        with self.lock:
            return copy.deepcopy([c for c in self.calls if method in (None, c["method"])])

    # --- faults --------------------------------------------------------------

    def arm(self, spec: Obj) -> Obj:
        fault = parse_fault(spec)
        with self.lock:
            self.fault_seq += 1
            fault = {"id": self.fault_seq, **fault, "armed_at": time.time()}
            self.faults.append(fault)
            return dict(fault)

    def take_fault(self, method: str) -> Obj | None:
        """The first armed fault for this method, used up by one call."""
        with self.lock:
            for fault in self.faults:
                if fault["remaining"] > 0 and fault["method"] in (None, method):
                    fault["remaining"] -= 1
                    return dict(fault)
            return None

    def list_faults(self) -> list[Obj]:
        with self.lock:
            return copy.deepcopy([f for f in self.faults if f["remaining"] > 0])

    def clear_faults(self) -> None:
        with self.lock:
            self.faults = []

    # --- Socket Mode ---------------------------------------------------------

    def new_ticket(self) -> str:
        ticket = secrets.token_hex(16)
        with self.lock:
            self.tickets[ticket] = time.time()
            return ticket

    def known_ticket(self, ticket: str | None) -> bool:
        with self.lock:
            return bool(ticket) and ticket in self.tickets

    def record_envelope(self, envelope: Obj, delivered_to: list[int]) -> None:
        with self.lock:
            self.envelopes.append({"envelope_id": envelope["envelope_id"],
                                   "type": envelope["type"], "envelope": envelope,
                                   "delivered_to": delivered_to, "sent_at": time.time()})

    def record_ack(self, envelope_id: Any, payload: Any, connection: int,
                   raw: Any = None) -> Obj:
        with self.lock:
            sent = [e for e in self.envelopes if e["envelope_id"] == envelope_id]
            now = time.time()
            ack: Obj = {"envelope_id": envelope_id, "payload": payload, "time": now,
                        "connection": connection, "known": bool(sent)}
            if sent:
                latency = now - sent[-1]["sent_at"]
                ack.update(type=sent[-1]["type"], latency_ms=round(latency * 1000, 1),
                           late=latency > 3.0)
            if raw is not None:
                ack["message"] = raw
            self.acks.append(ack)
            return dict(ack)

    def list_acks(self, envelope_id: str | None = None) -> list[Obj]:
        with self.lock:
            return copy.deepcopy([a for a in self.acks
                                  if envelope_id in (None, a["envelope_id"])])

    def envelope(self, envelope_id: str) -> Obj | None:
        with self.lock:
            found = [e for e in self.envelopes if e["envelope_id"] == envelope_id]
            return copy.deepcopy(found[-1]) if found else None

    # --- response_url --------------------------------------------------------

    def register_response(self, context: Obj, ttl: float | None = None,
                          max_uses: int | None = None) -> Obj:
        rid = secrets.token_hex(12)
        with self.lock:
            record = {"id": rid, **context, "created": time.time(),
                      "ttl": RESPONSE_URL_TTL if ttl is None else float(ttl),
                      "max_uses": RESPONSE_URL_USES if max_uses is None else int(max_uses),
                      "posts": [], "acks": []}
            self.responses[rid] = record
            return copy.deepcopy(record)

    def response(self, rid: str) -> Obj | None:
        with self.lock:
            found = self.responses.get(rid)
            return copy.deepcopy(found) if found else None

    def use_response(self, rid: str, body: Any, kind: str) -> tuple[Obj | None, str | None]:
        """Record a post (kind "post": a response_url use; "ack": the bot's immediate answer).
        Returns (record, refusal): refusal is Slack's error when the URL cannot be used."""
        with self.lock:
            record = self.responses.get(rid)
            entry = {"time": time.time(), "body": body}
            if record is None or record.get("unregistered"):
                # Not a URL the fake handed out: refused as Slack would, but kept, so a test
                # can see what was posted (GET /_lab/responses, "unregistered": true).
                record = self.responses.setdefault(rid, {
                    "id": rid, "unregistered": True, "created": time.time(), "posts": [],
                    "acks": []})
                record["posts" if kind == "post" else "acks"].append(
                    {**entry, "refused": "no_service"})
                return None, "no_service"
            if kind == "ack":
                record["acks"].append(entry)
                return copy.deepcopy(record), None
            refusal = None
            if time.time() - record["created"] > record["ttl"]:
                refusal = "expired_url"
            elif len([p for p in record["posts"] if not p.get("refused")]) >= record["max_uses"]:
                refusal = "used_url"
            if refusal:
                entry["refused"] = refusal
            record["posts"].append(entry)
            return copy.deepcopy(record), refusal

    def list_responses(self) -> list[Obj]:
        with self.lock:
            return copy.deepcopy(list(self.responses.values()))
