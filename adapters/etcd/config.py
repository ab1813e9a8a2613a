"""Configuration of the etcd adapter: where the members are and how to reach them."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_URL = re.compile(r"^https?://[^\s,/]+(:\d+)?/?$")


def _check_urls(value: str, what: str) -> list[str]:
    urls = [u.strip() for u in value.split(",")]
    for url in urls:
        if not _URL.match(url):
            raise ValueError(f"{what}: {url!r} is not a URL like http://10.0.0.1:2380")
    return urls


class EtcdConfig(BaseModel):
    """One etcd cluster.

    ``name``, ``initial_cluster`` and ``initial_advertise_peer_urls`` describe the member
    a snapshot is restored as (``snapshot restore --name ... --initial-cluster ...``);
    they must match how that member's etcd is started, or the restored member will not
    join. Only restore needs them.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoints: list[str] = Field(min_length=1)  # client URLs, e.g. https://10.0.0.1:2379
    etcdctl: str = "etcdctl"
    # Used for snapshot restore/status when it is on PATH (etcd 3.5+); else etcdctl (API 3).
    # None: always etcdctl.
    etcdutl: str | None = "etcdutl"
    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._-]{1,64}$")
    initial_cluster: str | None = None  # name1=https://10.0.0.1:2380,name2=...
    initial_advertise_peer_urls: str | None = None  # https://10.0.0.1:2380
    initial_cluster_token: str | None = None  # passed on only when set
    # etcd.snapshot_save writes only inside this folder (restore-etcd's safety snapshot)
    backup_dir: str = Field(default="/var/backups/etcd", pattern=r"^/")
    cacert: str | None = None
    cert: str | None = None
    key: str | None = None
    # etcd authentication: etcdctl gets them as ETCDCTL_USER/ETCDCTL_PASSWORD, never in argv.
    user: str | None = Field(default=None, pattern=r"^[^\s:]{1,128}$")
    password_env: str | None = None  # name of an environment variable holding the password
    dial_timeout: float = Field(default=2, gt=0)  # etcdctl --dial-timeout
    command_timeout: float = Field(default=5, gt=0)  # etcdctl --command-timeout
    timeout: float = Field(default=300, gt=0)  # limit of one etcdctl/etcdutl run, in seconds

    @field_validator("endpoints")
    @classmethod
    def _endpoints(cls, value: list[str]) -> list[str]:
        for endpoint in value:
            _check_urls(endpoint, "endpoints")
        return value

    @model_validator(mode="after")
    def _member(self) -> EtcdConfig:
        if (self.user is None) != (self.password_env is None):
            raise ValueError("user and password_env go together (etcdctl would prompt for "
                             "the password of a user given alone)")
        if self.initial_advertise_peer_urls is not None:
            _check_urls(self.initial_advertise_peer_urls, "initial_advertise_peer_urls")
        if self.initial_cluster is None:
            return self
        members: dict[str, list[str]] = {}
        for entry in self.initial_cluster.split(","):
            name, sep, url = entry.strip().partition("=")
            if not sep or not name:
                raise ValueError(f"initial_cluster: {entry!r} is not NAME=PEER_URL")
            members.setdefault(name, []).extend(_check_urls(url, "initial_cluster"))
        if self.name is not None and self.name not in members:
            raise ValueError(f"initial_cluster names no member {self.name!r} (name)")
        if self.name is not None and self.initial_advertise_peer_urls is not None:
            own = set(_check_urls(self.initial_advertise_peer_urls, "peer URLs"))
            if own != set(members[self.name]):
                raise ValueError(
                    f"initial_advertise_peer_urls {sorted(own)} differ from the URLs "
                    f"initial_cluster gives {self.name!r}: {members[self.name]}")
        return self

    def restore_member(self) -> tuple[str, str, str]:
        """(name, initial_cluster, initial_advertise_peer_urls), or a ValueError saying
        what to configure."""
        missing = [field for field in ("name", "initial_cluster", "initial_advertise_peer_urls")
                   if getattr(self, field) is None]
        if missing:
            raise ValueError(
                f"snapshot restore needs etcd.{', etcd.'.join(missing)} in the configuration "
                "(the member the snapshot becomes, as its etcd is started)")
        assert self.name and self.initial_cluster and self.initial_advertise_peer_urls
        return self.name, self.initial_cluster, self.initial_advertise_peer_urls
