"""HTTP to slurmrestd: the API version it offers, JSON requests with the JWT, clear errors.

Connection refused, timeouts, 401/403, 404, 5xx and Slurm's own ``errors`` become
SlurmError (SlurmctldUnreachable when slurmrestd says slurmctld does not answer).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import requests

from adapters.slurm import parsing
from adapters.slurm.backend import SlurmctldUnreachable, SlurmError
from adapters.slurm.config import RestConfig
from adapters.slurm.restauth import TokenSource

# Newest first; the Slurm release that introduced each.
RELEASES = {"v0.0.45": "26.05", "v0.0.44": "25.11", "v0.0.43": "25.05", "v0.0.42": "24.11",
            "v0.0.41": "24.05", "v0.0.40": "23.11", "v0.0.39": "23.02", "v0.0.38": "22.05"}
VERSIONS = list(RELEASES)
_PING = re.compile(r"^/slurm/(v0\.0\.\d+)/ping/?$")
# Slurm's words and error numbers for "slurmctld does not answer"
CONTROLLER_DOWN = ("Unable to contact slurm controller", "Slurm backup controller in standby",
                   "Communication connection failure")
# SLURM_COMMUNICATIONS_CONNECTION_ERROR and SLURMCTLD_COMMUNICATIONS_*: no controller
CONTROLLER_ERRNOS = {1001, 1800, 1801, 1802, 1803, 1804}
# SLURM_PROTOCOL_AUTHENTICATION_ERROR: 24.11+ slurmrestd passes a token on to slurmctld,
# which refuses one it cannot verify
AUTHENTICATION_ERRNO = 1007
NOTHING_FOUND_ERRNO = 9003  # slurmdbd: "Nothing found with query" (an empty answer)


class SlurmrestdUnreachable(SlurmError):
    """No HTTP answer from slurmrestd at all (refused, unresolvable, timed out)."""


def release(version: str) -> str:
    return f"Slurm {RELEASES.get(version, '?')}"


class RestClient:
    """One slurmrestd: ``get``/``post``/``delete`` of ``/slurm/{v}/...`` paths as JSON."""

    def __init__(self, config: RestConfig, timeout: float, tokens: TokenSource | None = None,
                 session: requests.Session | None = None) -> None:
        self.url = (config.url or "").rstrip("/")
        self.config = config
        self.timeout = timeout
        self.tokens = tokens or TokenSource(config)
        self.session = session or requests.Session()
        self.paths: set[tuple[str, str]] | None = None  # (method, path) from /openapi/v3
        self.version = self._pick_version()

    # -- discovery ----------------------------------------------------------------------

    def _pick_version(self) -> str:
        self.paths = self._openapi_paths()
        listed = {m.group(1) for _, p in self.paths or () if (m := _PING.match(p))}
        if self.config.api_version:
            pinned = self.config.api_version
            offered = [pinned] if pinned in listed or self._pings(pinned) else []
        elif listed & set(VERSIONS):
            offered = [v for v in VERSIONS if v in listed]
        else:  # no listing (or none of ours in it): ping from the newest down
            found = next((v for v in VERSIONS if self._pings(v)), None)
            offered = [found] if found else []
        if not offered:
            wanted = self.config.api_version or f"any of {', '.join(reversed(VERSIONS))}"
            raise SlurmError(f"slurmrestd at {self.url} offers no API version this bot speaks "
                             f"({wanted}): set slurm.rest.api_version or slurm.backend: cli")
        return offered[0]

    def _openapi_paths(self) -> set[tuple[str, str]] | None:
        """Every (method, path) the server documents; None when it documents nothing."""
        try:
            answer = self._send("GET", "/openapi/v3", None, None)
        except SlurmrestdUnreachable:
            raise
        except SlurmError:  # none, or not for us: the pings tell
            return None
        paths = answer.get("paths")
        if not isinstance(paths, Mapping):
            return None
        return {(method.upper(), path.rstrip("/") or "/") for path, methods in paths.items()
                if isinstance(methods, Mapping) for method in methods}

    def _pings(self, version: str) -> bool:
        try:
            self._send("GET", f"/slurm/{version}/ping", None, None)
        except SlurmError as exc:
            if "HTTP 404" in str(exc):
                return False
            raise
        return True

    def _answers(self, path: str) -> bool:
        try:
            self._send("GET", path, None, None)
        except SlurmError:
            return False
        return True

    def offers(self, method: str, template: str) -> bool | None:
        """Whether the server documents ``template`` (``/slurm/{v}/node/{node_name}``);
        None when it published no openapi document."""
        if self.paths is None:
            return None
        path = template.replace("{v}", self.version).rstrip("/")
        return (method.upper(), path) in self.paths

    # -- requests -----------------------------------------------------------------------

    def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        return self.request("GET", path, params=params)

    def request(self, method: str, path: str, params: Mapping[str, str] | None = None,
                body: Mapping[str, Any] | None = None,
                allow_empty: bool = False) -> dict[str, Any]:
        """``path`` may hold ``{v}``; ``allow_empty``: slurmdbd's "Nothing found" is no error."""
        full = path.replace("{v}", self.version)
        try:
            data = self._send(method, full, params, body)
            errors = [e for e in data.get("errors") or []
                      if not (allow_empty and isinstance(e, Mapping)
                              and e.get("error_number") == NOTHING_FOUND_ERRNO)]
            if errors:
                raise self._slurm_error(method, full, None, {"errors": errors})
        except SlurmctldUnreachable:
            raise
        except SlurmError as exc:
            if full.startswith("/slurm/") and "HTTP 5" in str(exc):
                self._raise_if_controller_down(exc)
            raise
        return data

    def _raise_if_controller_down(self, failure: SlurmError) -> None:
        """22.05 answers "Unspecified error" (HTTP 500) when slurmctld is down: its ping
        tells whether that is the cause."""
        try:
            pings = self._send("GET", f"/slurm/{self.version}/ping", None, None).get("pings")
        except SlurmError as exc:
            answer = str(exc)
        else:
            states = [str(p.get("ping")) for p in pings or [] if isinstance(p, Mapping)]
            if "UP" in states:
                return
            answer = f"ping {', '.join(states) or 'no answer'}"
        if not self._answers(f"/slurmdb/{self.version}/diag"):
            # 22.05 passes the token through: one Slurm refuses looks like this too
            raise SlurmError(
                f"{failure}; slurmrestd reaches neither slurmctld nor slurmdbd as user "
                f"{self.tokens.user}: Slurm refuses the token (signed with a key other than "
                "slurmctld's jwt_key, or a user Slurm does not know), or both daemons are "
                "down") from failure
        raise SlurmctldUnreachable(
            f"slurmctld is not answering ({failure}; slurmrestd {answer}): check that "
            "slurmctld runs and that slurmrestd's slurm.conf points at it") from failure

    def _send(self, method: str, path: str, params: Mapping[str, str] | None,
              body: Mapping[str, Any] | None, retried: bool = False) -> dict[str, Any]:
        where = f"{method} {path}"
        try:
            response = self.session.request(
                method, self.url + path, params=params, json=body, timeout=self.timeout,
                headers=self.tokens.headers(), verify=self.config.verify)
        except requests.Timeout as exc:
            raise SlurmrestdUnreachable(f"slurmrestd at {self.url} did not answer {where} within "
                             f"{self.timeout:g}s (slurm.timeout)") from exc
        except requests.ConnectionError as exc:
            raise SlurmrestdUnreachable(f"cannot connect to slurmrestd at {self.url} ({where}): "
                             f"{_reason(exc)}; check that slurmrestd runs and "
                             "slurm.rest.url") from exc
        if response.status_code in (401, 403) and not retried:
            self.tokens.invalidate()  # a renewed file or key may have a better one
            return self._send(method, path, params, body, retried=True)
        return self._answer(method, path, response)

    def _answer(self, method: str, path: str, response: requests.Response) -> dict[str, Any]:
        code = response.status_code
        try:
            data = response.json()
        except ValueError:
            data = None
        if code in (401, 403):
            raise SlurmError(
                f"slurmrestd at {self.url} refused the token of user {self.tokens.user} "
                f"(HTTP {code}, {method} {path}): check slurm.rest.user and the token's "
                "source (an expired token, or a key other than slurmctld's jwt_key)")
        if code == 404 and not isinstance(data, dict):
            raise SlurmError(f"slurmrestd at {self.url} has no {method} {path} (HTTP 404)")
        if not isinstance(data, dict):
            words = " ".join(response.text.split())[:200]
            raise SlurmError(f"slurmrestd at {self.url} answered {method} {path} with "
                             f"HTTP {code} and no JSON object", stderr=words)
        if code >= 400:
            raise self._slurm_error(method, path, code, data)
        return data

    def _slurm_error(self, method: str, path: str, code: int | None,
                     data: Mapping[str, Any]) -> SlurmError:
        detail = "; ".join(parsing.json_errors(data)) or "no detail"
        status = f"HTTP {code}, " if code is not None else ""
        where = f"slurmrestd {method} {path}"
        numbers = {e.get("error_number") for e in data.get("errors") or []
                   if isinstance(e, Mapping)}
        if AUTHENTICATION_ERRNO in numbers:
            return SlurmError(
                f"{where} failed ({status}{detail}): Slurm refuses the token of user "
                f"{self.tokens.user} (signed with a key other than slurmctld's jwt_key, or a "
                "user Slurm does not know)")
        if numbers & CONTROLLER_ERRNOS or any(w in detail for w in CONTROLLER_DOWN):
            return SlurmctldUnreachable(
                f"slurmctld is not answering ({where}: {detail}): check that slurmctld runs "
                "and that slurmrestd's slurm.conf points at it")
        if path.startswith("/slurmdb/") and ("database" in detail.lower()
                                             or "slurmdbd" in detail.lower()):
            return SlurmError(f"slurmdbd is not answering ({where}: {detail}): check that "
                              "slurmdbd and its database run")
        return SlurmError(f"{where} failed ({status}{detail})")


def _reason(exc: requests.ConnectionError) -> str:
    text = str(exc)
    for word in ("Connection refused", "Name or service not known", "No route to host",
                 "Connection reset"):
        if word in text:
            return word.lower()
    return text.split(": ")[-1][:160]
