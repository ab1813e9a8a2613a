"""The bot's configuration: one YAML file, validated by pydantic when read; every section is
optional (a few fields inside a section are required), unknown keys are refused.

With no file at all the bot runs on a SQLite database in the user's state folder,
with the runbooks shipped beside it and a small allow-list of harmless host
commands, so ``runbook run selftest`` works on a fresh install.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import pwd
import re
import sys
from collections.abc import Collection
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from adapters.alertmanager.config import AlertmanagerConfig
from adapters.etcd.config import EtcdConfig
from adapters.host import HostCommand
from adapters.kubernetes.config import KubernetesConfig
from adapters.mariadb import MariaDBConfig
from adapters.otlp.config import OtlpConfig
from adapters.prometheus.config import PrometheusConfig
from adapters.slurm.config import SlurmConfig
from adapters.syslog.config import SyslogConfig
from bot.config.drivers import DriversConfig
from bot.config.remediation import MigConfig, PoolsConfig, RemediationConfig
from kit import yamldoc
from kit.durations import parse_duration


def _duration_text(value: object) -> str:
    """A duration setting, checked when the file is read: text as written, a number as
    seconds."""
    seconds = parse_duration(value)  # type: ignore[arg-type]  # it refuses other types
    return value if isinstance(value, str) else f"{seconds:g}s"


def _refuse_secrets(data: object, keys: Collection[str], instead: str) -> object:
    """A section's raw data, unless it holds a secret: secrets never go in the file (it is
    read by more people than the secrets should be), and the error never echoes them."""
    if isinstance(data, dict):
        found = [key for key in data if key in keys]
        if found:
            raise ValueError(f"{', '.join(found)}: secrets do not belong in the configuration "
                             f"file; set {instead}")
    return data


# A duration in the one grammar (kit.durations): 90s, 30m, 1.5h, or a number of seconds.
DurationText = Annotated[str, BeforeValidator(_duration_text)]

CONFIG_ENV = "RUNBOOK_CONFIG"
DB_URL_ENV = "RUNBOOK_DB_URL"


class ConfigError(Exception):
    """The configuration file is missing or wrong; ``problems`` say where and why, one a
    line (``FILE:LINE: path: what is wrong``)."""

    def __init__(self, problems: str | list[str]) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class UserConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    groups: list[str] = Field(default_factory=list)


class NodeNames(BaseModel):
    """How one node is called in each system, when the names differ from the bot's name."""

    model_config = ConfigDict(extra="forbid")
    slurm: str | None = None
    kubernetes: str | None = None
    dcgm: str | None = None  # the DCGM exporter's Hostname / hostname label


class InventoryConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    nodes: list[str] = Field(default_factory=list)  # known nodes when nothing is discovered
    discover: bool = True  # ask the configured Slurm and Kubernetes for their nodes
    kubernetes_selector: str = "nvidia.com/gpu.present=true"  # which Kubernetes nodes count
    names: dict[str, NodeNames] = Field(default_factory=dict)  # bot name -> names elsewhere
    # a long-running bot (serve, engine, chat) lists the pools again when its inventory is
    # older than this at plan time: a node handed to the other pool plans with its new pool
    refresh_seconds: float = Field(default=5.0, ge=0, le=3600)


class LoggingConfig(BaseModel):
    """How `runbook serve` logs to stderr: text lines, or one JSON object per line (time,
    level, logger, message, execution_id and runbook where there is one). The environment
    variable RUNBOOK_LOG_FORMAT wins over it."""

    model_config = ConfigDict(extra="forbid")
    format: Literal["text", "json"] = "text"


class AlertRule(BaseModel):
    """An alert that proposes a runbook: labels to match, parameters from the alert's labels."""

    model_config = ConfigDict(extra="forbid")
    match: dict[str, str]  # label -> value; a value "a|b" matches either (exact alternatives)
    runbook: str | None = None
    # instead of runbook: a template for the alert's XID ("{{ labels.xid }}"); the XID table
    # (remediation.xid) picks the runbook: reset-gpu, reset-gpu method=reboot or swap-gpu
    xid: str | None = None
    params: dict[str, str] = Field(default_factory=dict)  # templates over `labels`
    auto_run: bool = False  # run without a person; honoured only for risk low runbooks

    @model_validator(mode="after")
    def _one_way(self) -> AlertRule:
        if (self.runbook is None) == (self.xid is None):
            raise ValueError("give runbook (the runbook to propose) or xid (the XID table "
                             "picks it), not both")
        return self


class ScheduleConfig(BaseModel):
    """A schedule the configuration declares (``schedules:``); kept in step with the
    database by the scheduler, by ``name``."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[a-z][a-z0-9-]{0,63}$")
    runbook: str
    params: dict[str, str | int | float | bool] = Field(default_factory=dict)
    cron: str | None = None  # crontab: minute hour day-of-month month day-of-week
    at: str | None = None  # one time, "2026-12-05 02:00" in ``tz``
    tz: str | None = None  # default: scheduling.timezone
    approve: Literal["ahead", "when_due"] = "when_due"
    requested_by: str = "config"  # the requester of its runs (requesters do not apply)


class SchedulingConfig(BaseModel):
    """How the leader fires schedules and maintenance windows (docs/schedules-and-windows.md)."""

    model_config = ConfigDict(extra="forbid")
    misfire_grace: DurationText = "15m"  # a fire time later than this is reported missed, not run
    poll_seconds: float = Field(default=10.0, gt=0)  # re-read schedules and windows this often
    timezone: str = "UTC"  # for cron= and at= given without tz=


# server: keys that would put the /alerts token itself in the file: refused, saying where
ALERTS_SECRET_KEYS = ("alerts_token", "token", "secret", "alerts_secret")


class ServerConfig(BaseModel):
    """``runbook serve``. The /alerts token is never here: RUNBOOK_ALERTS_TOKEN or the file
    ``alerts_token_file`` names (bot.runtime.access)."""

    model_config = ConfigDict(extra="forbid")
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)
    # POST /alerts: a webhook with more alerts is refused whole (413), none proposed
    max_alerts_per_request: int = Field(default=200, ge=1, le=10_000)
    # POST /alerts: bearer = Authorization: Bearer <token> (refused without one on a
    # non-loopback address); none = no authentication (something in front of the bot does it)
    alerts_auth: Literal["bearer", "none"] = "bearer"
    alerts_token_file: Path | None = None  # RUNBOOK_ALERTS_TOKEN wins over it
    # a firing alert updates its fingerprint's latest proposal instead of making a new one
    # when it is the same firing re-sent, or fires again less than this long after it
    # resolved or after the last firing began (bot.alerts.proposing.receive)
    alert_refire_seconds: float = Field(default=300.0, ge=0)
    # HTTP limits (bot.runtime.httpserver, bot.runtime.web): a client gets this long to send
    # a request's line and headers, then its body; an idle kept-alive connection is closed
    header_timeout_seconds: float = Field(default=10.0, gt=0, le=300)
    read_timeout_seconds: float = Field(default=10.0, gt=0, le=600)
    keepalive_seconds: float = Field(default=5.0, ge=1, le=300)
    # requests answered at once, and four times as many bodies read (503 with Retry-After
    # beyond; /healthz always answers)
    max_requests_in_flight: int = Field(default=64, ge=1, le=10_000)
    # on SIGTERM: stop accepting, give the requests in flight this long to finish
    shutdown_grace_seconds: float = Field(default=20.0, ge=1, le=600)
    # HTTPS: both files (PEM), relative to this file; neither: plain HTTP (TLS in front)
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_plain_token(cls, data: object) -> object:
        return _refuse_secrets(data, ALERTS_SECRET_KEYS, "RUNBOOK_ALERTS_TOKEN in the "
                               "environment or name a file with alerts_token_file")

    @model_validator(mode="after")
    def _token_needs_bearer(self) -> ServerConfig:
        if self.alerts_auth == "none" and self.alerts_token_file is not None:
            raise ValueError("alerts_token_file is set but alerts_auth is none: remove one")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together: set both or neither")
        return self


class PoolFloors(BaseModel):
    """Free GPUs each pool must keep after a capacity check, whatever the request says."""

    model_config = ConfigDict(extra="forbid")
    slurm: int = Field(default=0, ge=0)
    kubernetes: int = Field(default=0, ge=0)


class GuardsConfig(BaseModel):
    """Site floors under the runbooks' guards: no parameter lowers them and break-glass does
    not override them (docs/configuration.md)."""

    model_config = ConfigDict(extra="forbid")
    # capacity checks use max(the runbook's min_free_gpus_after, this pool's floor)
    min_free_gpus: PoolFloors = Field(default_factory=PoolFloors)


CHANGE = "change"  # the request word (change=REF) that carries a change or incident reference
MAX_CHANGE = 64
RiskWord = Literal["low", "medium", "high"]  # as bot.runbooks.model.Risk


def _high() -> list[RiskWord]:
    return ["high"]


class PolicyConfig(BaseModel):
    """Change references (``change=REF`` on a request): with ``require_change``, a request of
    a runbook whose risk is in ``change_risks`` needs one; any reference given must match
    ``change_pattern``. The plan shows it and its hash binds it (docs/configuration.md)."""

    model_config = ConfigDict(extra="forbid")
    require_change: bool = False
    change_pattern: str = r"^(CHG|INC)[0-9]{4,10}$"
    change_risks: list[RiskWord] = Field(default_factory=_high)

    @field_validator("change_pattern")
    @classmethod
    def _pattern(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        return value

    def change_problem(self, risk: str, change: str | None) -> str | None:
        """Why this reference (None: none given) cannot go with a runbook of ``risk``."""
        if change is None or not change.strip():
            if self.require_change and risk in self.change_risks:
                return (f"a {risk}-risk runbook needs a change or incident reference: add "
                        f"{CHANGE}=REF matching {self.change_pattern} (policy.require_change)")
            return None
        # fullmatch: "$" alone would let a trailing newline through
        if len(change) > MAX_CHANGE or not re.fullmatch(self.change_pattern, change):
            return (f"{CHANGE}={change[:MAX_CHANGE]!r} does not match {self.change_pattern} "
                    "(policy.change_pattern)")
        return None


class EngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lease_seconds: float = Field(default=30.0, gt=0)  # a dead engine's executions move after this
    poll_seconds: float = Field(default=1.0, gt=0)
    lock_ttl_seconds: float = Field(default=4 * 3600.0, gt=0)
    default_step_timeout: DurationText = "1h"
    max_parallel: int = Field(default=8, ge=1, le=256)  # executions one engine drives at once
    # a step asked to stop (cancel, timeout, lost claim) that has not returned after this
    # long leaves the execution held for a person; undo never runs beside it
    stop_grace_seconds: float = Field(default=10.0, gt=0)
    # how far apart the clocks of two replicas may be: a step under way in an engine that
    # stopped is run again only this long after that engine's lease ran out
    clock_skew_seconds: float = Field(default=1.0, ge=0)


SECRET_KEYS = ("token", "bot_token", "app_token", "signing_secret", "secret")


class SlackConfig(BaseModel):
    """Where and as whom the bot talks in Slack. Secrets are never here: they come from
    SLACK_BOT_TOKEN, SLACK_SIGNING_SECRET and SLACK_APP_TOKEN or from the files named below."""

    model_config = ConfigDict(extra="forbid")
    channel: str  # channel ID for plans, approvals, progress and proposals, e.g. C0RUNBOOK
    mode: str = Field(default="auto", pattern="^(auto|http|socket)$")  # auto: by the tokens
    users: dict[str, str] = Field(default_factory=dict)  # Slack user ID -> bot user name
    user_groups: dict[str, str] = Field(default_factory=dict)  # Slack user group ID -> group
    bot_token_file: Path | None = None
    signing_secret_file: Path | None = None
    app_token_file: Path | None = None
    poll_seconds: float = Field(default=1.0, gt=0, le=60)  # progress updates at most this often
    groups_refresh_seconds: float = Field(default=300.0, ge=10)
    # a Slack user not in `users`: readonly (read verbs only) or requester (may also request,
    # as slack:<ID>, when `requesters` admits them); never approve, deny or confirm
    unmapped: Literal["readonly", "requester"] = "readonly"

    @model_validator(mode="before")
    @classmethod
    def _no_plain_secrets(cls, data: object) -> object:
        return _refuse_secrets(data, SECRET_KEYS, "SLACK_BOT_TOKEN, SLACK_SIGNING_SECRET, "
                               "SLACK_APP_TOKEN in the environment or name files with "
                               "bot_token_file, signing_secret_file, app_token_file")


class LeaderElectionConfig(BaseModel):
    """Which of several ``runbook serve`` replicas runs executions and schedules
    (bot.runtime.leadership).

    ``method``: ``auto`` = ``none`` on SQLite (one replica only), else ``kubernetes`` when the
    bot runs in a cluster (KUBERNETES_SERVICE_HOST) and has a ``kubernetes`` section, else
    ``postgres`` (a session advisory lock); ``none`` = every replica leads.
    """

    model_config = ConfigDict(extra="forbid")
    method: Literal["auto", "postgres", "kubernetes", "none"] = "auto"
    lease_name: str = Field(default="gpu-runbook-bot", min_length=1, max_length=63)
    namespace: str | None = None  # of the Lease; default: the pod's own namespace
    lease_seconds: int = Field(default=15, ge=1)  # Kubernetes: a dead leader's Lease expires
    retry_seconds: float = Field(default=2.0, gt=0)  # the leader renews, followers try, this often

    @model_validator(mode="after")
    def _retry_within_lease(self) -> LeaderElectionConfig:
        if self.retry_seconds >= self.lease_seconds:
            raise ValueError("retry_seconds must be less than lease_seconds")
        return self


def shipped_runbooks() -> Path:
    """The runbooks that ship with the bot (wheel data, or the source checkout)."""
    bot_package = Path(__file__).parent.parent
    packaged = bot_package / "_runbooks"
    return packaged if packaged.is_dir() else bot_package.parent / "runbooks"


# The databases the bot runs on (bot.store.db): SQLite, and PostgreSQL through psycopg 3.
DATABASE_SCHEMES = ("sqlite", "sqlite+pysqlite", "postgresql", "postgresql+psycopg")


def database_url_problem(url: str) -> str | None:
    """Why the bot cannot use the database ``url``; None when its scheme is one it supports.
    The URL is never echoed (it may hold a password): only its scheme."""
    scheme, sep, _ = url.partition("://")
    supported = ("use sqlite:///PATH or postgresql://USER@HOST/DATABASE (the bot supports "
                 f"{', '.join(s + '://' for s in DATABASE_SCHEMES)})")
    if not sep or not scheme:
        return f"not a database URL: {supported}"
    if scheme.lower() not in DATABASE_SCHEMES:
        return f'"{scheme[:40]}://" is not a database the bot supports: {supported}'
    return None


def default_database_url() -> str:
    state = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state"))
    return f"sqlite:///{state / 'gpu-runbook-bot' / 'bot.db'}"


def default_host_commands() -> dict[str, HostCommand]:
    """Harmless commands the selftest runbook uses, allowed even with no configuration."""
    return {
        "selftest-uname": HostCommand(argv=["uname", "-sr"], description="kernel name/release"),
        "selftest-python": HostCommand(
            argv=[sys.executable, "-c", "import sys; print(sys.version.split()[0])"],
            description="the bot's Python answers",
        ),
    }


class ShipConfig(BaseModel):
    """Where the leader of ``runbook serve`` streams the audit log as it is written
    (bot.runtime.shipping): a syslog receiver, an OTLP collector or both, each from its own
    cursor, in batches of at most ``batch`` events; after a failure it waits
    ``retry_seconds``, doubled at each failure up to ``max_retry_seconds``."""

    model_config = ConfigDict(extra="forbid")
    syslog: SyslogConfig | None = None
    otlp: OtlpConfig | None = None
    batch: int = Field(default=200, ge=1, le=10_000)
    interval_seconds: float = Field(default=1.0, gt=0, le=300)  # new events looked for
    retry_seconds: float = Field(default=1.0, gt=0, le=300)
    max_retry_seconds: float = Field(default=30.0, gt=0, le=3600)

    @model_validator(mode="after")
    def _retries_grow(self) -> ShipConfig:
        if self.max_retry_seconds < self.retry_seconds:
            raise ValueError("max_retry_seconds must be at least retry_seconds")
        return self


class AuditConfig(BaseModel):
    """Checkpoints of the audit log (bot.store.checkpoints): its head appended to a file kept
    apart from the database, so that a cut or rewritten tail shows; and its shipping."""

    model_config = ConfigDict(extra="forbid")
    checkpoint_file: Path | None = None  # relative to this file; none: no checkpoints
    checkpoint_seconds: float = Field(default=300.0, ge=1)  # runbook serve records this often
    # also post each new checkpoint to the Slack channel (slack.channel), a second place
    # outside the database that an administrator of the database cannot edit
    checkpoint_chat: bool = False
    ship: ShipConfig = Field(default_factory=ShipConfig)  # to syslog and OTLP receivers


def principals(value: list[str]) -> list[str]:
    """Who a rule names: "*", "group:NAME" or "user:NAME" (ValueError naming one that is not)."""
    for item in value:
        if item != "*" and not item.startswith(("group:", "user:")):
            raise ValueError(f'"{item}" must be "*", "group:NAME" or "user:NAME"')
    return value


class ProxyIdentity(BaseModel):
    """The console's people as an authenticating proxy (oauth2-proxy) names them: a header
    it sets, believed only on connections from ``trusted`` addresses."""

    model_config = ConfigDict(extra="forbid")
    user_header: str = "X-Forwarded-User"
    email_header: str = "X-Forwarded-Email"
    name_from: Literal["user", "email"] = "user"  # which of the two is the bot's name
    trusted: list[str] = Field(min_length=1)  # the proxy's addresses or networks (CIDR)

    @field_validator("trusted")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for item in value:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f'"{item}" is not an address or network (CIDR)') from None
        return value


_SCRYPT_HASH = re.compile(r"scrypt\$[1-9]\d{0,9}\$[1-9]\d{0,4}\$[1-9]\d{0,4}"
                          r"\$[A-Za-z0-9+/]{16,}={0,2}\$[A-Za-z0-9+/]{16,}={0,2}")


class ConsoleConfig(BaseModel):
    """The read-only web console at /ui of ``runbook serve`` (bot.surfaces.console). With
    neither ``proxy`` nor ``basic`` it refuses everybody."""

    model_config = ConfigDict(extra="forbid")
    proxy: ProxyIdentity | None = None
    # HTTP basic for small sites: name -> hash from `runbook console hash-password`
    basic: dict[str, str] = Field(default_factory=dict)
    auditors: list[str] = Field(default_factory=list)  # see everything ("group:audit")
    page_size: int = Field(default=50, ge=1, le=500)

    @field_validator("basic")
    @classmethod
    def _hashed(cls, value: dict[str, str]) -> dict[str, str]:
        for name, hashed in value.items():
            if not hashed.startswith("scrypt$"):
                raise ValueError(f"{name}: a password must be the hash `runbook console "
                                 "hash-password` prints, never the password itself")
            if not _SCRYPT_HASH.fullmatch(hashed):  # cut short or edited: nobody could sign in
                raise ValueError(f"{name}: not a whole hash as `runbook console hash-password` "
                                 "prints it (scrypt$N$r$p$salt$digest)")
        return value

    @field_validator("auditors")
    @classmethod
    def _principals(cls, value: list[str]) -> list[str]:
        return principals(value)


class SecretsConfig(BaseModel):
    """The key that fingerprints and encrypts secret runbook parameters (``secret: true``):
    a file holding at least 32 characters (``openssl rand -base64 32``), or the environment
    variable RUNBOOK_SECRET_KEY, which wins over it. With neither, a runbook with a secret
    parameter is refused, and an execution holding one fails rather than run without it."""

    model_config = ConfigDict(extra="forbid")
    key_file: Path | None = None


class RunbooksConfig(BaseModel):
    """Which runbooks the bot loads: the shipped ones (less those ``exclude`` names) and the
    site's own folders or files (``paths``, relative to the configuration file). The older
    ``runbook_paths`` is the same as ``shipped: false`` with those paths."""

    model_config = ConfigDict(extra="forbid")
    shipped: bool = True  # the runbooks shipped with the bot (inside its package)
    paths: list[Path] = Field(default_factory=list)
    exclude: list[str] = Field(default_factory=list)  # shipped runbooks left out, by name

    @field_validator("exclude")
    @classmethod
    def _shipped_names(cls, value: list[str]) -> list[str]:
        known = shipped_names()
        for name in value:
            if name not in known:
                hint = difflib.get_close_matches(name, sorted(known), n=1)
                raise ValueError(f'"{name}" is not a shipped runbook'
                                 + (f' (did you mean "{hint[0]}"?)' if hint else ""))
        return value

    @model_validator(mode="after")
    def _exclude_needs_shipped(self) -> RunbooksConfig:
        if self.exclude and not self.shipped:
            raise ValueError("exclude leaves out shipped runbooks, but shipped is false")
        return self

    def resolved(self) -> list[Path]:
        """The files and folders to load: each shipped file not excluded, then ``paths``."""
        shipped = [file for file in sorted(shipped_runbooks().glob("*.yaml"))
                   if file.stem not in self.exclude] if self.shipped else []
        return [*shipped, *self.paths]


def shipped_names() -> set[str]:
    """The shipped runbooks' names: each file is named after its runbook (NAME.yaml)."""
    return {file.stem for file in shipped_runbooks().glob("*.yaml")}


class DatabaseConfig(BaseModel):
    """The database (its URL is ``database_url``): ``create: true`` lets any command create
    it when it is not there; by default only ``runbook db init`` does, so that a mistyped
    URL fails instead of starting a new, empty audit log."""

    model_config = ConfigDict(extra="forbid")
    create: bool = False


class Config(BaseModel):
    """Everything the bot reads from its configuration file."""

    model_config = ConfigDict(extra="forbid")

    lab: bool = False  # allows --as USER: for demos and tests only
    database_url: str | None = None
    database: DatabaseConfig = Field(default_factory=DatabaseConfig)  # create: db init only
    # the folders and files runbooks are loaded from: the shipped folder, else as `runbooks`
    # resolves (or, the older way, the site's own instead of the shipped ones)
    runbook_paths: list[Path] = Field(default_factory=lambda: [shipped_runbooks()])
    runbooks: RunbooksConfig = Field(default_factory=RunbooksConfig)
    users: dict[str, UserConfig] = Field(default_factory=dict)
    requesters: list[str] = Field(default_factory=lambda: ["*"])
    # who approves a runbook whose approval: names nobody; default nobody: a request that
    # needs approvals and that nobody may approve is refused, saying what to configure
    approvers: list[str] = Field(default_factory=list)
    approval_expires: DurationText = "30m"
    host_commands: dict[str, HostCommand] = Field(default_factory=default_host_commands)
    inventory: InventoryConfig = Field(default_factory=InventoryConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    guards: GuardsConfig = Field(default_factory=GuardsConfig)  # site floors
    policy: PolicyConfig = Field(default_factory=PolicyConfig)  # change references
    secrets: SecretsConfig = Field(default_factory=SecretsConfig)  # secret parameters' key
    mariadb: MariaDBConfig | None = None  # enables mariadb.dump / mariadb.restore
    slurm: SlurmConfig | None = None  # enables slurm.* actions and slurm checks
    kubernetes: KubernetesConfig | None = None  # enables k8s.* and gpu_operator.* actions
    etcd: EtcdConfig | None = None  # enables etcd.* actions
    server: ServerConfig = Field(default_factory=ServerConfig)
    leader_election: LeaderElectionConfig = Field(default_factory=LeaderElectionConfig)
    alert_rules: list[AlertRule] = Field(default_factory=list)
    prometheus: PrometheusConfig | None = None  # enables promql checks and prom.wait
    alertmanager: AlertmanagerConfig | None = None  # alerts checks, silences
    schedules: list[ScheduleConfig] = Field(default_factory=list)
    scheduling: SchedulingConfig = Field(default_factory=SchedulingConfig)
    slack: SlackConfig | None = None  # the Slack surface of `runbook serve`
    audit: AuditConfig = Field(default_factory=AuditConfig)
    console: ConsoleConfig = Field(default_factory=ConsoleConfig)  # /ui of runbook serve
    logging: LoggingConfig = Field(default_factory=LoggingConfig)  # text or json lines
    mig: MigConfig = Field(default_factory=MigConfig)  # layouts mig-reconfigure may apply
    pools: PoolsConfig = Field(default_factory=PoolsConfig)  # handoff-node's marks
    remediation: RemediationConfig = Field(default_factory=RemediationConfig)  # XIDs, breaker
    drivers: DriversConfig = Field(default_factory=DriversConfig)  # pinned drivers, CUDA table
    # Groups learnt at run time (Slack user group membership): user -> groups.
    _learnt_groups: dict[str, set[str]] = PrivateAttr(default_factory=dict)

    @field_validator("requesters", "approvers")
    @classmethod
    def _principals(cls, value: list[str]) -> list[str]:
        return principals(value)

    @field_validator("database_url")
    @classmethod
    def _database(cls, value: str | None) -> str | None:
        problem = None if value is None else database_url_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _no_name_looks_unmapped(self) -> Config:
        """slack:<ID> is how an unnamed Slack user acts: no configured person may be called
        that, or they would lose what "*" gives them (and an unnamed one could pose as them)."""
        names = [*self.users, *(self.slack.users.values() if self.slack else ())]
        clash = sorted(n for n in names if is_unmapped(n))
        if clash:
            raise ValueError(f"user names may not start with {UNMAPPED_PREFIX!r} (how a Slack "
                             f"user not in slack.users acts): {', '.join(clash)}")
        return self

    @model_validator(mode="after")
    def _runbooks_or_runbook_paths(self) -> Config:
        if "runbooks" in self.model_fields_set:
            if "runbook_paths" in self.model_fields_set:
                raise ValueError("give runbooks (shipped, paths, exclude) or the older "
                                 "runbook_paths, not both")
            self.runbook_paths = self.runbooks.resolved()
        return self

    @model_validator(mode="after")
    def _chat_checkpoints_need_chat(self) -> Config:
        if self.audit.checkpoint_chat and self.slack is None:
            raise ValueError("audit.checkpoint_chat posts to the Slack channel: configure "
                             "slack, or set it false")
        return self

    def resolved_database_url(self) -> str:
        return os.environ.get(DB_URL_ENV) or self.database_url or default_database_url()

    def groups_of(self, user: str) -> set[str]:
        entry = self.users.get(user)
        configured = set(entry.groups) if entry else set()
        return configured | self._learnt_groups.get(user, set())

    def learn_groups(self, groups: dict[str, set[str]]) -> None:
        """Replace the memberships learnt from outside (Slack user groups), by the bot's
        names of people: one person is one name, whichever surface they act from."""
        self._learnt_groups = {user: set(names) for user, names in groups.items()}

    def matches(self, user: str, principals: list[str], *, requesting: bool = False) -> bool:
        """True when ``user`` is one of ``principals`` ("*", "user:X", "group:G"). A Slack
        user the configuration does not name (``slack:<ID>``) is in no group, and "*" takes
        them in only to request runs (``requesting``) under ``slack.unmapped: requester``:
        never to approve, steer others' runs or reset the breaker."""
        groups = self.groups_of(user)
        anyone = not is_unmapped(user) or (
            requesting and self.slack is not None and self.slack.unmapped == "requester")
        for item in principals:
            kind, _, name = item.partition(":")
            if (item == "*" and anyone) or (kind == "user" and name == user) or (
                kind == "group" and name in groups
            ):
                return True
        return False


UNMAPPED_PREFIX = "slack:"  # a Slack user not in slack.users acts as slack:<ID>


def is_unmapped(user: str) -> bool:
    return user.startswith(UNMAPPED_PREFIX)


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Load the file named by ``path`` or $RUNBOOK_CONFIG; no file means the defaults."""
    chosen = path or os.environ.get(CONFIG_ENV)
    if not chosen:
        return Config()
    file = Path(chosen)
    try:
        raw, lines = yamldoc.parse(file.read_text(), file)
    except OSError as exc:
        raise ConfigError(f"cannot read configuration {file}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{file}: not text (UTF-8): {exc.reason}") from exc
    except yamldoc.YamlProblem as exc:
        raise ConfigError(exc.problems) from exc
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ConfigError(f"{file}:1: the configuration must be a mapping")
    base = file.parent
    if "runbook_paths" in raw and isinstance(raw["runbook_paths"], list):
        raw["runbook_paths"] = [str(base / p) if isinstance(p, str) else p
                                for p in raw["runbook_paths"]]
    runbooks = raw.get("runbooks")
    if isinstance(runbooks, dict) and isinstance(runbooks.get("paths"), list):
        runbooks["paths"] = [str(base / p) if isinstance(p, str) else p
                             for p in runbooks["paths"]]
    for section, keys in (("slack", ("bot_token_file", "signing_secret_file", "app_token_file")),
                          ("server", ("alerts_token_file", "tls_cert_file", "tls_key_file")),
                          ("audit", ("checkpoint_file",)),
                          ("audit.ship.syslog", ("ca_file", "cert_file", "key_file")),
                          ("audit.ship.otlp", ("headers_file", "ca_file", "cert_file",
                                               "key_file"))):
        found: Any = raw
        for part in section.split("."):  # a section inside another: audit.ship.syslog
            found = found.get(part) if isinstance(found, dict) else None
        if isinstance(found, dict):
            for key in keys:
                if isinstance(found.get(key), str):
                    found[key] = str(base / found[key])
    if isinstance(raw.get("host_commands"), dict):
        raw["host_commands"] = {**default_host_commands(), **raw["host_commands"]}
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        from bot.config.problems import problems

        raise ConfigError(problems(exc, Config, yamldoc.Locator(file, lines))) from exc


def current_user() -> str:
    """The OS account of this process: the identity of a terminal request (unless a lab
    configuration allows --as). It is the real uid's name in the password database, never
    LOGNAME, USER, LNAME or USERNAME: anyone can set those, and getpass.getuser() reads them
    first, so one account could request as one name and approve as another."""
    uid = os.getuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # no passwd entry (a container's arbitrary uid): still not settable
        return f"uid{uid}"
