"""How ``client.make_api_client`` would reach the API, resolved without importing the
official client (``quickread``): the in-cluster service account, or a kubeconfig with a
bearer token, client certificate, CA, tls-server-name and insecure-skip-tls-verify, as
``kubernetes.config`` reads them. ``Unsupported`` for anything else (exec plugins, auth
providers, basic auth, proxies, several kubeconfig files): the official client handles it.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from adapters.kubernetes.config import KubernetesConfig

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_REREAD = 60.0  # seconds, as the official in-cluster loader
UNSUPPORTED_USER = ("auth-provider", "exec", "username", "password")
_temp_files: list[str] = []


class Unsupported(Exception):
    """A setting only the official client handles: use it."""


@dataclass
class Access:
    """Where the API answers and how to reach it, as ``kubernetes.client`` would."""

    host: str
    authorization: str | None = None
    token_file: str | None = None  # in-cluster: the token, re-read every minute
    read_at: float = 0.0
    verify: bool = True
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None

    def header(self) -> str | None:
        if self.token_file is not None and time.monotonic() - self.read_at >= TOKEN_REREAD:
            self.authorization = "bearer " + _read_token(self.token_file)
            self.read_at = time.monotonic()
        return self.authorization


def resolve(config: KubernetesConfig) -> Access:
    """The Access ``make_api_client`` would configure; Unsupported (or an error reading
    the configuration) when only the official client should say."""
    if any(key.lower().endswith("_proxy") and key.lower() != "no_proxy" and value
           for key, value in os.environ.items()):
        raise Unsupported("a proxy from the environment")
    if config.kubeconfig is None:
        return _in_cluster()
    return _from_kubeconfig(config.kubeconfig, config.context)


def _in_cluster() -> Access:
    host, port = (os.environ.get(f"KUBERNETES_SERVICE_{k}") for k in ("HOST", "PORT"))
    token, ca = f"{SERVICE_ACCOUNT}/token", f"{SERVICE_ACCOUNT}/ca.crt"
    if not host or not port or not os.path.isfile(token) or not os.path.isfile(ca):
        raise Unsupported("no in-cluster service account")
    with open(ca) as f:
        if not f.read():
            raise Unsupported("empty CA file")
    bracket = ":" in host or "%" in host
    access = Access(host="https://" + (f"[{host}]:{port}" if bracket else f"{host}:{port}"),
                    token_file=token, ca_file=ca)
    access.header()
    return access


def _read_token(path: str) -> str:
    with open(path) as f:
        content = f.read()
    if not content:
        raise Unsupported("empty token file")
    return content


def _from_kubeconfig(path: str, context: str | None) -> Access:
    import yaml

    if ":" in path:
        raise Unsupported("several kubeconfig files")
    path = os.path.expanduser(path)
    with open(path) as f:
        try:
            data = yaml.safe_load(f)
        except yaml.YAMLError as exc:
            raise Unsupported("not YAML") from exc
    ctx = _named(data["contexts"], context or data["current-context"])["context"]
    user: Mapping[str, Any] | None = None
    if ctx.get("user") and data.get("users"):
        found = [u for u in data["users"] if u["name"] == ctx["user"]]
        user = _value(_one(found, ctx["user"]), "user", Mapping) if found else None
    cluster = _named(data["clusters"], ctx["cluster"])["cluster"]
    base = os.path.abspath(os.path.dirname(path))
    if user is not None and any(key in user for key in UNSUPPORTED_USER):
        raise Unsupported("an authentication only the official client knows")
    if "proxy-url" in cluster or not isinstance(cluster.get("server"), str):
        raise Unsupported("a proxy, or no server")
    access = Access(host=cluster["server"].rstrip("/"))
    token = _file_or_data(user, "tokenFile", "token", base, encoded=False)
    if token:
        access.authorization = f"Bearer {token}"
    if access.host.startswith("https"):
        access.ca_file = _as_file(cluster, "certificate-authority", base)
        access.cert_file = _as_file(user or {}, "client-certificate", base)
        access.key_file = _as_file(user or {}, "client-key", base)
    if "insecure-skip-tls-verify" in cluster:
        access.verify = not _value(cluster, "insecure-skip-tls-verify")
    if "tls-server-name" in cluster:
        access.server_name = _value(cluster, "tls-server-name")
    return access


def _named(items: Any, name: str) -> Any:
    return _one([item for item in items if item["name"] == name], name)


def _one(found: list[Any], name: str) -> Any:
    if len(found) != 1 or not isinstance(found[0], Mapping):
        raise Unsupported(f"{len(found)} entries named {name}")
    return found[0]


def _value(obj: Mapping[str, Any], key: str, kind: type = object) -> Any:
    """``obj[key]``, a scalar unless ``kind`` says otherwise; where the official loader
    refuses a null (or reads a list or a mapping differently): Unsupported."""
    value = obj[key]
    if value is None or not isinstance(value, kind) or (
            kind is object and isinstance(value, (dict, list))):
        raise Unsupported(f"{key}: {value!r}")
    return value


def _file_or_data(obj: Mapping[str, Any] | None, file_key: str, data_key: str,
                  base: str, *, encoded: bool = True) -> Any:
    """The data (``*-data``, preferred) or the file's content, as ``FileOrData.as_data``."""
    if not obj:
        return None
    if data_key in obj:
        return _value(obj, data_key)
    if file_key in obj:
        with open(os.path.normpath(os.path.join(base, _value(obj, file_key)))) as f:
            content = f.read()
        return base64.standard_b64encode(content.encode()).decode() if encoded else content
    return None


def _as_file(obj: Mapping[str, Any], key: str, base: str) -> str | None:
    """A file holding ``KEY-data`` (base64-decoded, removed at exit) or ``KEY``'s path, as
    ``FileOrData.as_file``."""
    data = _value(obj, f"{key}-data") if f"{key}-data" in obj else None
    if data:
        fd, name = tempfile.mkstemp()
        if not _temp_files:
            atexit.register(_remove_temp_files)
        _temp_files.append(name)
        with os.fdopen(fd, "wb") as f:
            f.write(base64.standard_b64decode(data.encode() if isinstance(data, str) else data))
        return name
    if key not in obj or f"{key}-data" in obj:
        return None
    path = os.path.normpath(os.path.join(base, _value(obj, key)))
    if not os.path.isfile(path):
        raise Unsupported(f"File does not exist: {path}")  # the official client says so
    return path


def _remove_temp_files() -> None:
    for name in _temp_files:
        with contextlib.suppress(OSError):
            os.remove(name)
    _temp_files.clear()
