"""The lab's GPU telemetry: DCGM-exporter simulator, real Prometheus and Alertmanager.

`lab fault` changes what the simulator reports at the next scrape (1 s); Prometheus
evaluates deploy/prometheus/gpu-alerts.yaml (lab copy: every `for:` 0s) each second and
sends alerts to Alertmanager, which posts them to the bot's webhook port. Every wait polls.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from tests.lab.fixture import Lab

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "gpu-alerts.yaml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "gpu-alerts.test.yaml"
GPUS = 8
WAIT = 15.0  # first scrape after a Prometheus start takes ~5 s; a fault ~1-2 s
METRICS = {
    "DCGM_FI_DEV_GPU_TEMP": "gauge", "DCGM_FI_DEV_POWER_USAGE": "gauge",
    "DCGM_FI_DEV_GPU_UTIL": "gauge", "DCGM_FI_DEV_FB_USED": "gauge",
    "DCGM_FI_DEV_XID_ERRORS": "gauge", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "counter",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "counter",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "gauge",
}
LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "hostname",
          "DCGM_FI_DRIVER_VERSION"}
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
T = TypeVar("T")


# --- helpers ---------------------------------------------------------------

def http(method: str, url: str, body: Any = None, timeout: float = 5) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        raw = response.read()
    return json.loads(raw) if raw.strip() else None


def text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def wait_for(check: Callable[[], T | None], what: str, timeout: float = WAIT) -> T:
    """Poll until `check` returns something truthy; fail with `what` and the last value."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            value = check()
        except (OSError, urllib.error.URLError, ValueError) as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        time.sleep(0.2)
    pytest.fail(f"{what}: not after {timeout:g}s (last: {last!r})")


def parse_metrics(page: str) -> tuple[dict[str, str], list[tuple[str, dict[str, str], float]]]:
    """({metric: type}, [(metric, labels, value)]) of a Prometheus text page."""
    types, samples = {}, []
    for line in page.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            types[name] = kind
        elif line and not line.startswith("#"):
            head, _, value = line.rpartition(" ")
            name, _, rest = head.partition("{")
            samples.append((name, dict(LABEL.findall(rest)), float(value)))
    return types, samples


class Monitoring:
    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.info: dict[str, Any] = lab["monitoring"]
        self.prom = self.info["prometheus_url"]
        self.am = self.info["alertmanager_url"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        answer = http("GET", f"{self.prom}/api/v1/query?"
                      + urllib.parse.urlencode({"query": promql}))
        assert answer["status"] == "success", answer
        return list(answer["data"]["result"])

    def value(self, promql: str) -> float | None:
        result = self.query(promql)
        return float(result[0]["value"][1]) if result else None

    def prom_alerts(self, name: str, state: str = "firing") -> list[dict[str, str]]:
        alerts = http("GET", f"{self.prom}/api/v1/alerts")["data"]["alerts"]
        return [a["labels"] for a in alerts
                if a["labels"]["alertname"] == name and a["state"] == state]

    def am_alerts(self, **labels: str) -> list[dict[str, Any]]:
        query = urllib.parse.urlencode(
            [("filter", f'{k}="{v}"') for k, v in labels.items()] + [("active", "true")])
        return list(http("GET", f"{self.am}/api/v2/alerts?{query}"))

    def fault(self, node: str, *pairs: str) -> None:
        result = self.lab.lab("fault", node, *pairs)
        assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def mon(lab: Lab) -> Monitoring:
    m = Monitoring(lab)
    wanted = len(m.info["nodes"]) * GPUS
    wait_for(lambda: m.value("count(DCGM_FI_DEV_GPU_TEMP)") == wanted,
             f"Prometheus scraped {wanted} GPUs")
    return m


@pytest.fixture
def faults(mon: Monitoring) -> Iterator[list[str]]:
    """Nodes a test faults; cleared afterwards, then their alerts must resolve."""
    touched: list[str] = []
    yield touched
    for node in touched:
        mon.fault(node, "clear")
    wait_for(lambda: not [a for a in http("GET", f"{mon.prom}/api/v1/alerts")["data"]["alerts"]
                          if a["labels"].get("node") in touched] or None,
             "alerts of the cleared nodes resolved")


class Webhook(HTTPServer):
    """A stand-in for the bot's /alerts endpoint on the bot's lab port; it keeps the bodies
    and the Authorization headers Alertmanager sent."""

    def __init__(self, port: int) -> None:
        super().__init__(("127.0.0.1", port), self.Handler)
        self.bodies: list[dict[str, Any]] = []
        self.authorizations: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        server: Webhook

        def do_POST(self) -> None:
            size = int(self.headers.get("Content-Length", 0))
            if self.path == "/alerts":
                self.server.bodies.append(json.loads(self.rfile.read(size)))
                self.server.authorizations.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass


@pytest.fixture
def webhook(mon: Monitoring) -> Iterator[Webhook]:
    try:
        server = Webhook(mon.info["bot_port"])
    except OSError:
        pytest.skip(f"bot port {mon.info['bot_port']} in use (a bot is serving there)")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                              daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


# --- rules -----------------------------------------------------------------

def test_rules_pass_promtool() -> None:
    if not shutil.which("promtool"):
        pytest.skip("promtool not installed (Debian package prometheus)")
    check = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True,
                           text=True, timeout=60, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run(["promtool", "test", "rules", str(RULE_TESTS)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert unit.returncode == 0, unit.stdout + unit.stderr


# --- simulator -------------------------------------------------------------

def test_simulator_serves_every_node_and_gpu(lab: Lab, mon: Monitoring) -> None:
    nodes = mon.info["nodes"]
    assert set(lab["nodes"]) | set(lab["kubeapi"]["nodes"]) == set(nodes)
    types, samples = parse_metrics(text(mon.info["dcgm_url"]))
    drivers = {n: lab.lab("driver", n).stdout.strip() for n in nodes}
    for name, kind in METRICS.items():
        assert types[name] == kind
        series = [labels for metric, labels, _ in samples if metric == name]
        assert {(s["Hostname"], s["gpu"]) for s in series} == {
            (n, str(g)) for n in nodes for g in range(GPUS)}, name
        for s in series:
            assert set(s) >= LABELS, s
            assert s["hostname"] == s["Hostname"]
            assert s["device"] == f"nvidia{s['gpu']}"
            assert s["modelName"] == "NVIDIA H100 80GB HBM3"
            assert s["DCGM_FI_DRIVER_VERSION"] == drivers[s["Hostname"]]
    utils = [v for metric, _, v in samples if metric == "DCGM_FI_DEV_GPU_UTIL"]
    assert all(35 <= u <= 90 for u in utils)
    assert len({s["UUID"] for m, s, _ in samples if m == "DCGM_FI_DEV_GPU_TEMP"}) == \
        len(nodes) * GPUS


def test_faults_change_the_simulator(lab: Lab, mon: Monitoring, faults: list[str]) -> None:
    node = lab["nodes"][0]
    faults.append(node)
    bad = lab.lab("fault", node, "util=lots")
    assert bad.returncode == 1 and "util must be an integer" in bad.stderr
    assert lab.lab("fault", node, "gpu_missing=8").returncode == 1
    mon.fault(node, "util=0", "temp=95", "gpu=2", "ecc_dbe=3", "row_remap_failure=1",
              "driver=550.54.15", "xid=48", "xid_gpu=1")
    mon.fault(node, "xid=48")
    _, samples = parse_metrics(text(f"{mon.info['dcgm_url']}?node={node}"))

    def value(metric: str, gpu: int) -> float:
        return next(v for m, s, v in samples if m == metric and s["gpu"] == str(gpu))

    assert {s["Hostname"] for _, s, _ in samples} == {node}
    assert all(v == 0 for m, _, v in samples if m == "DCGM_FI_DEV_GPU_UTIL")
    assert value("DCGM_FI_DEV_GPU_TEMP", 2) == 95 and value("DCGM_FI_DEV_GPU_TEMP", 0) < 90
    assert value("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 2) == 3
    assert value("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 0) == 0
    assert value("DCGM_FI_DEV_ROW_REMAP_FAILURE", 2) == 1
    assert value("DCGM_FI_DEV_XID_ERRORS", 1) == 48 and value("DCGM_FI_DEV_XID_ERRORS", 0) == 0
    counts = [(s["gpu"], s["xid"], v) for m, s, v in samples if m == "DCGM_EXP_XID_ERRORS_COUNT"]
    assert counts == [("1", "48", 2)]  # two `xid=48` events on GPU 1
    assert {s["DCGM_FI_DRIVER_VERSION"] for _, s, _ in samples} == {"550.54.15"}


# --- Prometheus and Alertmanager -------------------------------------------

def test_prometheus_scrapes_every_gpu(mon: Monitoring) -> None:
    assert mon.value("count(DCGM_FI_DEV_GPU_TEMP)") == len(mon.info["nodes"]) * GPUS
    ups = mon.query('up{job="dcgm"}')
    assert {r["metric"]["node"] for r in ups} == set(mon.info["nodes"])
    assert all(r["value"][1] == "1" for r in ups)
    by_host = mon.query("count by (Hostname, hostname) (DCGM_FI_DEV_XID_ERRORS)")
    assert {(r["metric"]["Hostname"], r["metric"]["hostname"]) for r in by_host} == {
        (n, n) for n in mon.info["nodes"]}
    rules = http("GET", f"{mon.prom}/api/v1/rules")["data"]["groups"]
    names = {r["name"] for g in rules for r in g["rules"] if r["health"] == "ok"}
    assert {"GpuXidFallenOffBus", "GpuXidUncorrectable", "GpuEccDoubleBit",
            "GpuRowRemapFailure", "GpuTemperatureHigh", "GpuMissing",
            "DcgmExporterDown"} <= names


def test_xid_79_fires_and_reaches_alertmanager_and_webhook(
    lab: Lab, mon: Monitoring, faults: list[str], webhook: Webhook
) -> None:
    node = "gpu02"
    faults.append(node)
    began = time.monotonic()
    mon.fault(node, "xid=79", "xid_gpu=3")
    wait_for(lambda: mon.value(f'DCGM_FI_DEV_XID_ERRORS{{Hostname="{node}", gpu="3"}}') == 79,
             "XID 79 in Prometheus")
    assert mon.value(f'DCGM_EXP_XID_ERRORS_COUNT{{Hostname="{node}", xid="79"}}') == 1
    firing = wait_for(lambda: mon.prom_alerts("GpuXidFallenOffBus"), "GpuXidFallenOffBus firing")
    assert [(a["node"], a["gpu"], a["xid"], a["severity"]) for a in firing] == [
        (node, "3", "79", "critical")]
    in_am = wait_for(lambda: mon.am_alerts(alertname="GpuXidFallenOffBus", node=node),
                     "GpuXidFallenOffBus in Alertmanager")
    assert in_am[0]["labels"]["gpu"] == "3" and in_am[0]["status"]["state"] == "active"
    # this node's firing: an earlier firing (another test's) may still be resolving
    posted = wait_for(lambda: [a for b in webhook.bodies for a in b["alerts"]
                               if a["labels"]["alertname"] == "GpuXidFallenOffBus"
                               and a["labels"].get("node") == node
                               and a["status"] == "firing"], "webhook notified")
    assert webhook.bodies[0]["version"] == "4"
    # the bot's /alerts takes only its bearer token: Alertmanager sends it (credentials_file)
    token = Path(mon.info["alerts_token_file"]).read_text().strip()
    assert len(token) >= 32 and set(webhook.authorizations) == {f"Bearer {token}"}
    assert posted[0]["status"] == "firing" and posted[0]["labels"]["node"] == node
    assert time.monotonic() - began < 10
    # every alert this fault raised (GpuXidFallenOffBus and the XID table's GpuXid) must be
    # heard resolved: one whose resolution never reached a receiver stays notified in
    # Alertmanager's log, and the same alert firing again later is then not sent before
    # repeat_interval (1h in the lab)
    raised = {"GpuXidFallenOffBus", "GpuXid"}
    wait_for(lambda: raised <= {a["labels"]["alertname"] for b in webhook.bodies
                                for a in b["alerts"]
                                if a["status"] == "firing" and a["labels"].get("node") == node},
             "GpuXid notified too")
    mon.fault(node, "clear")
    wait_for(lambda: raised <= {a["labels"]["alertname"] for b in webhook.bodies
                                for a in b["alerts"]
                                if a["status"] == "resolved" and a["labels"]["node"] == node},
             "resolved notifications")


def test_gpu_missing_and_exporter_down(lab: Lab, mon: Monitoring, faults: list[str]) -> None:
    missing, down = "gpu03", "gpu07"
    faults += [missing, down]
    mon.fault(missing, "gpu_missing=3")
    mon.fault(down, "exporter=down")
    wait_for(lambda: mon.value(f'count(DCGM_FI_DEV_GPU_TEMP{{Hostname="{missing}"}})') == 7,
             "7 GPUs left")
    assert not mon.query(f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{missing}", gpu="3"}}')
    alerts = wait_for(lambda: mon.prom_alerts("GpuMissing"), "GpuMissing firing")
    assert [(a["node"], a["gpu"]) for a in alerts] == [(missing, "3")]
    wait_for(lambda: mon.value(f'up{{job="dcgm", node="{down}"}}') == 0, "exporter down")
    alerts = wait_for(lambda: mon.prom_alerts("DcgmExporterDown"), "DcgmExporterDown firing")
    assert [a["node"] for a in alerts] == [down]
    mon.fault(missing, "clear")
    mon.fault(down, "clear")
    wait_for(lambda: mon.value("count(DCGM_FI_DEV_GPU_TEMP)") == len(mon.info["nodes"]) * GPUS,
             "every GPU back")


def test_alertmanager_api_alerts_and_silences(mon: Monitoring) -> None:
    marker = f"lab-test-{time.time_ns()}"
    http("POST", f"{mon.am}/api/v2/alerts", [{
        "labels": {"alertname": "LabTestAlert", "node": "gpu04", "test": marker},
        "annotations": {"summary": "posted by test_monitoring"},
    }])
    found = wait_for(lambda: mon.am_alerts(test=marker), "posted alert listed", timeout=5)
    assert found[0]["labels"]["node"] == "gpu04"
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 1))
    ends = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now + 3600))
    created = http("POST", f"{mon.am}/api/v2/silences", {
        "matchers": [{"name": "test", "value": marker, "isRegex": False, "isEqual": True}],
        "startsAt": stamp, "endsAt": ends, "createdBy": "test_monitoring", "comment": "lab"})
    silence_id = created["silenceID"]
    silenced = wait_for(lambda: [a for a in http("GET", f"{mon.am}/api/v2/alerts?"
                                                 + urllib.parse.urlencode(
                                                     {"filter": f'test="{marker}"'}))
                                 if a["status"]["silencedBy"] == [silence_id]],
                        "alert silenced", timeout=5)
    assert silenced[0]["status"]["state"] == "suppressed"
    http("DELETE", f"{mon.am}/api/v2/silence/{silence_id}")
    state = http("GET", f"{mon.am}/api/v2/silence/{silence_id}")["status"]["state"]
    assert state == "expired"
    # Resolve the posted alert so nothing of it lingers.
    http("POST", f"{mon.am}/api/v2/alerts", [{
        "labels": found[0]["labels"], "endsAt": time.strftime(
            "%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 1))}])


def test_lab_json_env_and_status(lab: Lab, mon: Monitoring) -> None:
    info = mon.info
    base = lab["port_base"]
    assert info["dcgm_url"] == f"http://127.0.0.1:{base + 7}/metrics"
    assert info["prometheus_url"] == f"http://127.0.0.1:{base + 8}"
    assert info["alertmanager_url"] == f"http://127.0.0.1:{base + 9}"
    assert info["bot_webhook_url"] == f"http://127.0.0.1:{base + 390}/alerts"
    assert Path(info["rules_file"]).read_text().count("for: 0s") >= 3
    env = lab.lab("env").stdout
    assert f"PROMETHEUS_URL={info['prometheus_url']}" in env
    assert f"ALERTMANAGER_URL={info['alertmanager_url']}" in env
    token_file = Path(info["alerts_token_file"])
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert f"RUNBOOK_ALERTS_TOKEN={token_file.read_text().strip()}" in env
    assert yaml.safe_load(Path(lab["bot_config"]).read_text())["server"][
        "alerts_token_file"] == str(token_file)
    status = lab.lab("status")
    assert status.returncode == 0, status.stdout
    assert info["prometheus_url"] in status.stdout
    config = Path(info["alertmanager_config"]).read_text()
    assert info["bot_webhook_url"] in config and "send_resolved: true" in config
    receiver = yaml.safe_load(config)["receivers"][0]["webhook_configs"][0]
    assert receiver["http_config"] == {"authorization": {
        "type": "Bearer", "credentials_file": str(token_file)}}


def test_backfill_history(lab: Lab, mon: Monitoring, tmp_path: Path) -> None:
    now = int(time.time())
    lines = ["# HELP grb_lab_backfill_probe Lab backfill probe.",
             "# TYPE grb_lab_backfill_probe gauge"]
    lines += [f'grb_lab_backfill_probe{{node="gpu01"}} {m} {now - m * 60}'
              for m in range(180, 59, -1)]
    source = tmp_path / "history.om"
    source.write_text("\n".join([*lines, "# EOF"]) + "\n")
    result = lab.lab("backfill", str(source))
    assert result.returncode == 0, result.stderr
    answer = http("GET", f"{mon.prom}/api/v1/query?" + urllib.parse.urlencode(
        {"query": 'grb_lab_backfill_probe{node="gpu01"}', "time": now - 120 * 60}))
    assert [r["value"][1] for r in answer["data"]["result"]] == ["120"]


def test_service_stop_and_start(lab: Lab, mon: Monitoring) -> None:
    restarted = time.time()
    for name, url in (("prometheus", f"{mon.prom}/-/ready"),
                      ("alertmanager", f"{mon.am}/-/ready"),
                      ("dcgm", mon.info["dcgm_url"])):
        assert lab.lab("service", name, "stop").returncode == 0
        with pytest.raises(urllib.error.URLError):
            text(url)
        assert lab.lab("service", name, "status").returncode == 1
        started = lab.lab("service", name, "start")
        assert started.returncode == 0, started.stderr
        assert text(url)
    # Fresh scrapes (samples from before the restart are still within the lookback).
    wait_for(lambda: mon.value(f'count(timestamp(up{{job="dcgm"}} == 1) > {restarted})')
             == len(mon.info["nodes"]), "every node scraped again after the restarts")
    wait_for(lambda: not mon.prom_alerts("DcgmExporterDown") or None,
             "DcgmExporterDown resolved")
