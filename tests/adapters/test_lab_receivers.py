"""The lab's audit receivers as `lab up` starts them (labkit.rsyslog, labkit.otlp), in a lab
folder of the test's own (never the shared lab): they start, take what the bot ships, stop;
and the lab's bot.yaml ships to both."""

from __future__ import annotations

from pathlib import Path

from labkit import daemons, procs, render  # deploy/lab: on the path (tests.adapters.receivers)
from labkit import otlp as lab_otlp
from labkit import rsyslog as lab_rsyslog
from labkit.layout import SERVICE_OFFSETS, Layout, Ports, port_free

from adapters.otlp.client import OtlpClient
from adapters.otlp.config import OtlpConfig
from adapters.syslog.client import SyslogClient
from adapters.syslog.config import SyslogConfig
from bot.config import load_config
from tests.adapters.auditevents import chain
from tests.adapters.receivers import free_port, need


def own_lab(tmp_path: Path) -> tuple[Layout, Ports]:
    """A lab folder, and ports whose +392 (rsyslog) and +393 (otlp) are free."""
    layout = Layout(tmp_path / "lab")
    layout.make_dirs()
    while not port_free((port := free_port()) + 1):
        pass
    return layout, Ports(port - SERVICE_OFFSETS["rsyslog"], 1)


def test_the_lab_starts_rsyslogd_and_the_otlp_receiver(tmp_path: Path) -> None:
    need("rsyslogd", "rsyslog")
    layout, ports = own_lab(tmp_path)
    syslog_daemon = lab_rsyslog.daemon(layout, ports)
    otlp_daemon = lab_otlp.daemon(layout, ports)
    assert otlp_daemon is not None, "the venv's Python imports opentelemetry-proto"
    try:
        for daemon in (syslog_daemon, otlp_daemon):
            assert daemons.start(layout, daemon)
        SyslogClient(SyslogConfig(host="127.0.0.1", port=ports.service("rsyslog"))).send(
            chain(2))
        OtlpClient(OtlpConfig(endpoint=lab_otlp.url(ports.service("otlp")))).send(chain(3))
        assert [r["event"]["seq"] for r in lab_rsyslog.received(
            lab_rsyslog.received_file(layout))] == [1, 2]
        assert len(lab_otlp.received(lab_otlp.received_file(layout))) == 3
        assert (layout.etc / "rsyslog.conf").exists()
    finally:
        procs.stop(layout, [lab_rsyslog.NAME, lab_otlp.NAME])
    assert procs.running_pid(layout, lab_rsyslog.NAME) is None


def test_the_lab_bot_ships_to_both_receivers(tmp_path: Path) -> None:
    layout, ports = own_lab(tmp_path)
    layout.bot_yaml.write_text(render.bot_yaml(layout, ["gpu01"], ports, "http://restd"))
    ship = load_config(layout.bot_yaml).audit.ship
    assert ship.syslog is not None and ship.otlp is not None
    assert ship.syslog.address == f"syslog://127.0.0.1:{ports.service('rsyslog')}"
    assert ship.otlp.logs_url == f"http://127.0.0.1:{ports.service('otlp')}/v1/logs"
    assert lab_rsyslog.info(layout, ports)["port"] == ports.base + 392
