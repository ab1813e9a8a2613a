"""The syslog destination (adapters.syslog) against a real rsyslogd the test starts: RFC 5424
in octet-counted frames, the event's JSON as MSG, seq and hash in STRUCTURED-DATA; TLS with a
client certificate; and the close that proves a batch was read, or not."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from labkit import rsyslog as lab_rsyslog  # deploy/lab: on the path (receivers)

from adapters.auditlog import DeliveryError, DestinationSetupError
from adapters.syslog.client import SyslogClient
from adapters.syslog.config import SyslogConfig
from adapters.syslog.rfc5424 import frame, message
from tests.adapters.auditevents import chain
from tests.adapters.receivers import Rsyslogd, make_pki, need


def client_for(port: int, **settings: object) -> SyslogClient:
    return SyslogClient(SyslogConfig.model_validate(
        {"host": "127.0.0.1", "port": port, "hostname": "bot-host", "timeout_seconds": 5,
         **settings}))


def test_a_message_is_rfc5424_in_an_octet_counted_frame() -> None:
    event = chain(1)[0]
    body = message(event, hostname="bot host", procid="42", sd_id="audit@32473")
    header = (f'<110>1 {event.ts} bot_host gpu-runbook-bot 42 step_finished '
              f'[audit@32473 seq="1" hash="{event.hash}" prev_hash="{event.prev_hash}"] ')
    assert body == header.encode() + event.as_json().encode()
    assert json.loads(event.as_json())["data"] == {"n": 1, "text": 'ünï "quoted"]'}
    framed = frame(body)
    length, _, rest = framed.partition(b" ")
    assert int(length) == len(rest) == len(body) and rest == body  # bytes, not characters


def test_a_batch_reaches_rsyslogd_as_sent(rsyslogd: Rsyslogd) -> None:
    events = chain(3)
    assert client_for(rsyslogd.port).send(events).rejected == 0
    rsyslogd.wait_for(3)
    lines = rsyslogd.lines()
    assert [line["event"] for line in lines] == [json.loads(e.as_json()) for e in events]
    first = lines[0]
    assert (first["pri"], first["ts"], first["hostname"], first["app"], first["msgid"]) == (
        "110", events[0].ts, "bot-host", "gpu-runbook-bot", "step_finished")
    assert first["params"] == {"seq": "1", "hash": events[0].hash,
                               "prev_hash": events[0].prev_hash}


def test_an_event_of_100_kib_arrives_whole(rsyslogd: Rsyslogd) -> None:
    big = chain(1, data={"output": "x" * 100_000})
    client_for(rsyslogd.port).send(big)
    assert rsyslogd.wait_for(1) == [1]
    assert rsyslogd.events()[0]["data"]["output"] == "x" * 100_000


def test_a_stopped_receiver_is_a_delivery_error(rsyslogd: Rsyslogd) -> None:
    rsyslogd.stop()
    with pytest.raises(DeliveryError, match="refused") as failed:
        client_for(rsyslogd.port).send(chain(2))
    assert failed.value.retryable


def test_tls_with_a_client_certificate(tmp_path: Path) -> None:
    need("rsyslogd", "rsyslog")
    if not Path("/usr/lib/x86_64-linux-gnu/rsyslog/lmnsd_ossl.so").exists() and not list(
            Path("/usr/lib").glob("*/rsyslog/lmnsd_ossl.so")):
        need("no-such-program-rsyslog-openssl", "rsyslog-openssl")
    pki = make_pki(tmp_path / "pki")
    folder = tmp_path / "tls"
    folder.mkdir()
    receiver = Rsyslogd(folder, lab_rsyslog.Tls(pki.ca, pki.server_cert, pki.server_key,
                                                client_certificates=True))
    receiver.start()
    try:
        tls = {"tls": True, "ca_file": str(pki.ca), "server_name": "localhost"}
        client_for(receiver.port, **tls, cert_file=str(pki.client_cert),
                   key_file=str(pki.client_key)).send(chain(2))
        assert receiver.wait_for(2) == [1, 2]
        with pytest.raises(DeliveryError):  # no client certificate: refused, never read
            client_for(receiver.port, **tls).send(chain(1, start=3))
        with pytest.raises(DeliveryError, match="certificate") as untrusted:
            client_for(receiver.port, tls=True, server_name="localhost").send(chain(1))
        assert not untrusted.value.retryable  # the system CAs do not know this one
        assert receiver.seqs() == [1, 2]
    finally:
        receiver.stop()


def test_unusable_tls_files_stop_the_client_being_made(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("not a certificate")
    with pytest.raises(DestinationSetupError, match="syslog TLS files"):
        client_for(1, tls=True, ca_file=str(tmp_path / "ca.pem"))


@pytest.fixture
def tcp_server() -> Iterator[Callable[[Callable[[socket.socket], None]], int]]:
    """A loopback TCP server that handles one connection with the given function."""
    threads: list[threading.Thread] = []

    def serve(handle: Callable[[socket.socket], None]) -> int:
        listener = socket.create_server(("127.0.0.1", 0))

        def accept() -> None:
            with listener, listener.accept()[0] as conn:
                handle(conn)

        threads.append(threading.Thread(target=accept, daemon=True))
        threads[-1].start()
        return int(listener.getsockname()[1])

    yield serve
    for thread in threads:
        thread.join(5)


def test_a_receiver_that_closes_without_reading_is_not_a_delivery(
        tcp_server: Callable[[Callable[[socket.socket], None]], int]) -> None:
    closed = threading.Event()

    def close_unread(conn: socket.socket) -> None:
        conn.recv(10)  # a few bytes only: the rest stays unread, so the close is a reset
        closed.set()

    with pytest.raises(DeliveryError):
        client_for(tcp_server(close_unread)).send(chain(50))
    assert closed.is_set()


def test_a_receiver_that_reads_everything_then_closes_is_a_delivery(
        tcp_server: Callable[[Callable[[socket.socket], None]], int]) -> None:
    got = bytearray()

    def read_all(conn: socket.socket) -> None:
        while data := conn.recv(65536):
            got.extend(data)

    client = client_for(tcp_server(read_all))
    client.send(chain(50))
    assert bytes(got) == client.payload(chain(50))


def test_a_receiver_that_never_closes_is_not_a_delivery(
        tcp_server: Callable[[Callable[[socket.socket], None]], int]) -> None:
    release = threading.Event()

    def hold(conn: socket.socket) -> None:
        while conn.recv(65536):
            pass
        release.wait(5)  # read all, saw our close, but keeps its side open

    with pytest.raises(DeliveryError, match=r"within 0\.3s"):
        client_for(tcp_server(hold), timeout_seconds=0.3).send(chain(3))
    release.set()
