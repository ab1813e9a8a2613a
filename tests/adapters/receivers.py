"""Real receivers of the audit log that a test starts, stops and starts again itself, on a
free loopback port in its own folder: Debian's rsyslogd with the lab's configuration
(labkit.rsyslog), optionally TLS, and the lab's OTLP receiver (deploy/lab/otlpsink).
Loaded as a pytest plugin (tests/conftest.py): fixtures ``rsyslogd``, ``otlp_sink``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.lab.fixture import REPO

sys.path.insert(0, str(REPO / "deploy" / "lab"))
from labkit import otlp as lab_otlp
from labkit import rsyslog as lab_rsyslog

READY_SECONDS = 10.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Receiver:
    """A receiver process: ``start`` (waits until it listens), ``stop`` (SIGTERM, as a
    service manager stops it), ``events`` (what it received, parsed)."""

    name = "receiver"

    def __init__(self, folder: Path, received: str) -> None:
        self.folder = folder
        self.port = free_port()
        self.received = folder / received  # what it wrote of what it received
        self.output = folder / "process.out"
        self.process: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    def listening(self) -> bool:
        return lab_rsyslog.listening(self.port)

    def start(self) -> None:
        assert self.process is None, f"{self.name} runs already"
        with self.output.open("ab") as out:
            self.process = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=out,
                                            stderr=subprocess.STDOUT, env=self.environment(),
                                            start_new_session=True, cwd=self.folder)
        deadline = time.monotonic() + READY_SECONDS
        while not self.listening():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{self.name} did not start:\n{self.tail()}")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def tail(self) -> str:
        return self.output.read_text(errors="replace")[-3000:] if self.output.exists() else ""

    def events(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def seqs(self) -> list[int]:
        return [int(event["seq"]) for event in self.events()]

    def wait_for(self, seq: int, seconds: float = 10.0) -> list[int]:
        """Poll until event ``seq`` arrived; the positions received in order."""
        deadline = time.monotonic() + seconds
        while seq not in (found := self.seqs()):
            assert time.monotonic() < deadline, f"event {seq} never arrived: {found[-5:]}"
            time.sleep(0.02)
        return found


class Rsyslogd(Receiver):
    name = "rsyslogd"

    def __init__(self, folder: Path, tls: lab_rsyslog.Tls | None = None) -> None:
        super().__init__(folder, "received.log")
        self.tls = tls
        self.own_log = folder / "rsyslogd.log"

    def argv(self) -> list[str]:
        conf, work = self.folder / "rsyslog.conf", self.folder / "work"
        work.mkdir(exist_ok=True)
        conf.write_text(lab_rsyslog.config(self.port, self.received, work, self.own_log,
                                           self.tls))
        return lab_rsyslog.argv(conf, self.folder / "rsyslogd.pid")

    def tail(self) -> str:
        own = self.own_log.read_text(errors="replace") if self.own_log.exists() else ""
        return super().tail() + own[-3000:]

    def lines(self) -> list[dict[str, Any]]:
        return lab_rsyslog.received(self.received)

    def events(self) -> list[dict[str, Any]]:
        return [line["event"] for line in self.lines()]


class OtlpSink(Receiver):
    name = "otlpsink"

    def __init__(self, folder: Path) -> None:
        super().__init__(folder, "received.jsonl")

    def argv(self) -> list[str]:
        return lab_otlp.argv(sys.executable, self.port, self.received, self.folder / "otlp.log")

    def environment(self) -> dict[str, str]:
        return lab_otlp.environment()

    def listening(self) -> bool:
        return lab_otlp.ready(self.port)

    @property
    def endpoint(self) -> str:
        return lab_otlp.url(self.port)

    def records(self) -> list[dict[str, Any]]:
        return lab_otlp.received(self.received)

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(record["body"]) for record in self.records()]

    def fault(self, **spec: Any) -> None:
        """Arm a fault (otlpsink/server.py): status=503 count=2, reject=1, delay=5; none
        clears."""
        request = urllib.request.Request(f"{self.endpoint}/_lab/fault", method="POST",
                                         data=json.dumps(spec).encode())
        with urllib.request.urlopen(request, timeout=5):
            pass


def need(program: str, package: str) -> None:
    if shutil.which(program) is None:
        message = f"{program} is missing (apt-get install {package}; `make test` does)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def fresh(receiver: Receiver) -> Receiver:
    """The receiver running, with nothing received and no fault armed: one process serves
    every test of a session (starting one takes longer than most of the tests)."""
    if receiver.process is None or receiver.process.poll() is not None:
        receiver.process = None
        receiver.start()
    if isinstance(receiver, OtlpSink):
        receiver.fault()
    if receiver.received.exists():  # rsyslogd appends (O_APPEND): it goes on from the start
        receiver.received.write_bytes(b"")
    return receiver


@pytest.fixture(scope="session")
def _rsyslogd_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rsyslogd]:
    need("rsyslogd", "rsyslog")
    receiver = Rsyslogd(tmp_path_factory.mktemp("rsyslog"))
    yield receiver
    receiver.stop()


@pytest.fixture(scope="session")
def _otlp_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OtlpSink]:
    receiver = OtlpSink(tmp_path_factory.mktemp("otlp"))
    yield receiver
    receiver.stop()


@pytest.fixture
def rsyslogd(_rsyslogd_process: Rsyslogd) -> Rsyslogd:
    """A running rsyslogd (plain TCP) that has received nothing yet; the test may stop and
    start it."""
    fresh(_rsyslogd_process)
    return _rsyslogd_process


@pytest.fixture
def otlp_sink(_otlp_process: OtlpSink) -> OtlpSink:
    """A running OTLP/HTTP receiver that has received nothing yet, no fault armed; the test
    may stop and start it."""
    fresh(_otlp_process)
    return _otlp_process


@dataclass(frozen=True)
class Pki:
    """A throw-away CA and the certificates it signed, made with the openssl command."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_pki(folder: Path) -> Pki:
    need("openssl", "openssl")
    folder.mkdir(exist_ok=True)

    def run(*argv: str) -> None:
        subprocess.run(["openssl", *argv], check=True, capture_output=True, cwd=folder)

    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *curve, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=shipping test CA")
    for name, usage, alt in (("server", "serverAuth", "DNS:localhost,IP:127.0.0.1"),
                             ("client", "clientAuth", "DNS:gpu-runbook-bot")):
        (folder / f"{name}.ext").write_text(
            f"subjectAltName={alt}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n"
            f"extendedKeyUsage={usage}\nauthorityKeyIdentifier=keyid,issuer\n"
            "subjectKeyIdentifier=hash\n")
        run("req", *curve, "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", f"/CN={name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")
    return Pki(folder / "ca.pem", folder / "server.pem", folder / "server.key",
               folder / "client.pem", folder / "client.key")
