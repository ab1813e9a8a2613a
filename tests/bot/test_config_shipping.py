"""The ``audit.ship`` section: paths relative to the configuration file, and a malformed
section refused with an error that names the key and says what is wrong; ``runbook serve``
refuses a destination it cannot use before it starts anything."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.config import ConfigError, load_config
from bot.store import db
from bot.surfaces import cli


def written(tmp_path: Path, ship: dict[str, Any]) -> Path:
    path = tmp_path / "etc" / "bot.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump({"database_url": f"sqlite:///{tmp_path / 'bot.db'}",
                                    "audit": {"ship": ship}}))
    db.init(f"sqlite:///{tmp_path / 'bot.db'}")  # `runbook db init`: serve never creates it
    return path


def test_both_destinations_with_paths_relative_to_the_file(tmp_path: Path) -> None:
    config = load_config(written(tmp_path, {
        "syslog": {"host": "logs.example", "tls": True, "ca_file": "tls/ca.pem",
                   "cert_file": "/abs/client.pem", "key_file": "tls/client.key"},
        "otlp": {"endpoint": "https://otel.example:4318", "headers_file": "otlp.headers"},
        "batch": 100, "interval_seconds": 0.5}))
    ship, etc = config.audit.ship, tmp_path / "etc"
    assert ship.syslog is not None and ship.otlp is not None
    assert ship.syslog.ca_file == etc / "tls" / "ca.pem"
    assert ship.syslog.cert_file == Path("/abs/client.pem")
    assert ship.syslog.key_file == etc / "tls" / "client.key"
    assert ship.syslog.address == "syslog+tls://logs.example:6514"
    assert ship.otlp.headers_file == etc / "otlp.headers"
    assert ship.otlp.logs_url == "https://otel.example:4318/v1/logs"
    assert (ship.batch, ship.interval_seconds, ship.max_retry_seconds) == (100, 0.5, 30.0)
    assert load_config(written(tmp_path, {})).audit.ship.syslog is None  # off by default


@pytest.mark.parametrize(("ship", "said"), [
    ({"syslog": {"port": 514}}, "audit.ship.syslog.host: Field required"),
    ({"syslog": {"host": "h", "port": 70000}}, "audit.ship.syslog.port: Input should be less"),
    ({"syslog": {"host": "h", "ca_file": "ca.pem"}}, "ca_file, cert_file, key_file and "
     "server_name need tls: true"),
    ({"syslog": {"host": "h", "tls": True, "cert_file": "c.pem"}}, "cert_file and key_file "
     "go together"),
    ({"syslog": {"host": "h", "sd_id": "a b"}}, "is not an SD-ID"),
    ({"syslog": {"host": "h", "facility": 4}}, "audit.ship.syslog.facility: unknown field"),
    ({"otlp": {"endpoint": "collector:4318"}}, "is not a URL like http://collector:4318"),
    ({"otlp": {"endpoint": "http://c", "headers": {"Authorization": "Bearer x"}}},
     "headers: secrets do not belong in the configuration file"),
    ({"batch": 0}, "audit.ship.batch: Input should be greater than or equal to 1"),
    ({"retry_seconds": 10, "max_retry_seconds": 5}, "max_retry_seconds must be at least"),
    ({"kafka": {}}, "audit.ship.kafka: unknown field"),
])
def test_a_malformed_section_is_refused_saying_why(tmp_path: Path, ship: dict[str, Any],
                                                    said: str) -> None:
    with pytest.raises(ConfigError, match=r"bot.yaml:\d+: .*" + said.replace("(", r"\(")) as error:
        load_config(written(tmp_path, ship))
    assert "Bearer x" not in str(error.value)


def test_serve_refuses_a_destination_it_cannot_use(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = written(tmp_path, {"otlp": {"endpoint": "http://127.0.0.1:9",
                                       "headers_file": "missing.headers"}})
    with socket.create_server(("127.0.0.1", 0)) as taken:  # should it start: it cannot
        port = str(taken.getsockname()[1])
        assert cli.main(["--config", str(path), "serve", "--port", port]) == cli.EXIT_BAD_INPUT
    assert "audit.ship: cannot read the OTLP headers file" in capsys.readouterr().err
