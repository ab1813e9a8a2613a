"""The rest backend against a fake slurmrestd at the HTTP level (a local http.server).

v0.0.38 answers are captured from the lab's slurmrestd 22.05.8; v0.0.42 ones are the
hand-made 24.11 data_parser fixtures; the listings of 24.11 and 26.05 are their servers'
own. The real writes run in test_slurm_versions.py; the error cases are checked here.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from adapters.slurm.backend import SlurmctldUnreachable, SlurmError
from adapters.slurm.config import SlurmConfig
from adapters.slurm.transports.choice import make_backend
from adapters.slurm.transports.rest.auth import TokenSource, claims, mint
from adapters.slurm.transports.rest.backend import RestBackend

FIXTURES = Path(__file__).parent / "fixtures"
KEY = b"k" * 32
Answer = tuple[int, Any] | Callable[[dict[str, Any]], tuple[int, Any]]


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


class FakeSlurmrestd:
    """Answers (method, path) from ``routes``; 404 (plain text, as slurmrestd) otherwise.
    Records every request: method, path, query, headers, JSON body."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], Answer] = {}
        self.requests: list[dict[str, Any]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                seen = {"method": self.command, "path": parts.path,
                        "query": parse_qs(parts.query), "headers": dict(self.headers),
                        "body": json.loads(raw) if raw else None}
                fake.requests.append(seen)
                answer = fake.routes.get((self.command, parts.path))
                if callable(answer):
                    answer = answer(seen)
                code, body = answer or (404, "Unable find requested URL.")
                data = (body if isinstance(body, str) else json.dumps(body)).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (the timeout test)
                    pass

            do_GET = do_POST = do_DELETE = _serve

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()

    def offer(self, *versions: str, openapi: bool = True, extra: tuple[str, ...] = ()) -> None:
        """Ping (and, with ``openapi``, a listing) for each version; ``extra``: more
        listed "METHOD /path" entries."""
        paths: dict[str, dict[str, Any]] = {}
        for version in versions:
            self.routes[("GET", f"/slurm/{version}/ping")] = (200, ok({"pings": [
                {"hostname": "ctl", "ping": "UP", "status": 0}]}))
            for path in ("ping", "nodes", "jobs", "reservations", "diag"):
                paths[f"/slurm/{version}/{path}"] = {"get": {}}
        for entry in extra:
            method, path = entry.split(" ", 1)
            paths.setdefault(path, {})[method.lower()] = {}
        if openapi:
            self.routes[("GET", "/openapi/v3")] = (200, {"openapi": "3.0.3", "paths": paths})

    def sent(self, method: str) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["method"] == method]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def ok(data: dict[str, Any]) -> dict[str, Any]:
    return {"meta": {}, "errors": [], **data}


@pytest.fixture
def server() -> Iterator[FakeSlurmrestd]:
    fake = FakeSlurmrestd()
    yield fake
    fake.close()


def config(url: str, **rest: Any) -> SlurmConfig:
    sources = {"token_file", "token_env", "key_file"}
    source = {} if sources & set(rest) else {"token_env": "SLURM_JWT"}
    return SlurmConfig.model_validate({"backend": "rest", "timeout": 2,
                                       "rest": {"url": url, "user": "root", **source, **rest}})


def backend(url: str, token: str | None = None, **rest: Any) -> RestBackend:
    cfg = config(url, **rest)
    environ = {"SLURM_JWT": token or mint(KEY, "root", 3600, time.time())}
    return RestBackend(cfg, tokens=TokenSource(cfg.rest, environ=environ))


# -- version picking ------------------------------------------------------------------------

def test_the_newest_listed_version_is_picked(server: FakeSlurmrestd) -> None:
    server.offer("v0.0.38", "v0.0.39", "v0.0.40", "v0.0.41")
    assert backend(server.url).api_version == "v0.0.41"
    assert [r["path"] for r in server.requests] == ["/openapi/v3"]


def test_without_a_listing_pings_go_from_newest_to_oldest(server: FakeSlurmrestd) -> None:
    server.offer("v0.0.38", "v0.0.40", openapi=False)
    assert backend(server.url).api_version == "v0.0.40"
    assert [r["path"] for r in server.requests] == [
        "/openapi/v3", "/slurm/v0.0.45/ping", "/slurm/v0.0.44/ping", "/slurm/v0.0.43/ping",
        "/slurm/v0.0.42/ping", "/slurm/v0.0.41/ping", "/slurm/v0.0.40/ping"]


def test_a_failing_listing_falls_back_to_pings(server: FakeSlurmrestd) -> None:
    server.offer("v0.0.39", openapi=False)
    server.routes[("GET", "/openapi/v3")] = (500, {"errors": [{"error": "Unspecified error"}]})
    rest = backend(server.url)
    assert rest.api_version == "v0.0.39"
    assert rest.unsupported("update_nodes") is None  # v0.0.39 is documented to have it
    assert "needs v0.0.43" in str(rest.unsupported("create_reservation"))


def test_a_pinned_version_is_used_or_refused(server: FakeSlurmrestd) -> None:
    server.offer("v0.0.38", "v0.0.41")
    assert backend(server.url, api_version="v0.0.38").api_version == "v0.0.38"
    with pytest.raises(SlurmError, match=r"offers no API version this bot speaks \(v0.0.40\)"):
        backend(server.url, api_version="v0.0.40").nodes()


def test_a_server_of_unknown_versions_only_is_refused(server: FakeSlurmrestd) -> None:
    server.offer("v0.0.36", "v0.0.37")
    with pytest.raises(SlurmError, match=r"offers no API version this bot speaks.*backend: cli"):
        backend(server.url).nodes()


def test_constructing_the_backend_sends_nothing(server: FakeSlurmrestd) -> None:
    made = make_backend(config(server.url))
    assert isinstance(made, RestBackend) and server.requests == []


# -- reads: v0.0.38 as captured from the lab, v0.0.42 in the 24.11 shapes --------------------

def serve_v38(server: FakeSlurmrestd) -> None:
    server.routes[("GET", "/openapi/v3")] = (200, fixture("slurmrestd-22.05-openapi-paths.json"))
    for path, name in (("/slurm/v0.0.38/ping", "diag"), ("/slurm/v0.0.38/nodes", "nodes"),
                       ("/slurm/v0.0.38/jobs", "jobs"), ("/slurm/v0.0.38/diag", "diag"),
                       ("/slurm/v0.0.38/reservations", "reservations"),
                       ("/slurmdb/v0.0.38/accounts", "accounts"),
                       ("/slurmdb/v0.0.38/jobs", "slurmdb-jobs")):
        server.routes[("GET", path)] = (200, fixture(f"slurmrestd-v0.0.38-{name}.json"))


def test_v38_nodes_jobs_and_reservations_as_the_lab_served_them(
        server: FakeSlurmrestd) -> None:
    serve_v38(server)
    rest = backend(server.url)
    assert rest.api_version == "v0.0.38"
    nodes = {n.name: n for n in rest.nodes()}
    assert sorted(nodes) == ["gpu01", "gpu02", "gpu03", "gpu04", "gpu05"]
    assert nodes["gpu02"].drained and nodes["gpu02"].reason == "XID 79"
    assert nodes["gpu02"].reason_user == "root" and nodes["gpu02"].reason_time
    assert nodes["gpu03"].state == "mixed" and nodes["gpu03"].gpus_used == 2
    assert nodes["gpu03"].jobs == [1] and nodes["gpu01"].gres == "gpu:h100:8"
    assert [n.name for n in rest.nodes(["gpu04", "gpu01", "gpu99"], with_jobs=False)] == [
        "gpu04", "gpu01"]
    [job] = rest.jobs(["gpu03"])
    assert (job.id, job.user, job.account, job.state, job.nodes) == (
        1, "root", "ml-research", "RUNNING", ["gpu03"])
    assert rest.jobs(["gpu01"]) == []
    [resv] = rest.reservations()
    assert resv.name == "grb-test-cap" and resv.nodes == ["gpu04"] and resv.users == ["root"]
    assert {"MAINT", "IGNORE_JOBS"} <= resv.flags
    length = datetime.fromisoformat(resv.end) - datetime.fromisoformat(resv.start)
    assert length == timedelta(seconds=600)


def test_v38_accounts_diag_and_an_empty_accounting_period(server: FakeSlurmrestd) -> None:
    serve_v38(server)
    server.routes[("GET", "/slurmdb/v0.0.38/jobs")] = (
        200, fixture("slurmrestd-v0.0.38-slurmdb-nothing-found.json"))
    rest = backend(server.url)
    assert rest.accounts() == ["cv-research", "ml-research", "root"]
    assert rest.dbd_queue() == 0
    start = datetime(2026, 12, 2, 12, 0, 0)
    assert rest.accounting(start, start + timedelta(hours=1)) == []
    query = server.requests[-1]["query"]
    assert query == {"start_time": ["2026-12-02T12:00:00"], "end_time": ["2026-12-02T13:00:00"]}


def test_v38_accounting_rows(server: FakeSlurmrestd) -> None:
    serve_v38(server)
    data = fixture("slurmrestd-v0.0.38-slurmdb-jobs.json")
    server.routes[("GET", "/slurmdb/v0.0.38/jobs")] = (200, data)
    job = data["jobs"][0]
    began = datetime.fromtimestamp(job["time"]["start"] - 60)
    [usage] = backend(server.url).accounting(began, began + timedelta(hours=1))
    gpus = next(t["count"] for t in job["tres"]["allocated"] if t["name"] == "gpu")
    seconds = job["time"]["end"] - job["time"]["start"]
    assert usage.account == job["account"] and usage.jobs == 1
    assert usage.gpu_hours == pytest.approx(gpus * seconds / 3600, abs=1e-6)


def serve_v42(server: FakeSlurmrestd, *extra: str) -> None:
    server.offer("v0.0.38", "v0.0.42", extra=extra)
    for path, name in (("nodes", "scontrol-nodes-24.11.json"), ("jobs", "squeue-24.11.json")):
        server.routes[("GET", f"/slurm/v0.0.42/{path}")] = (200, fixture(name))
    server.routes[("GET", "/slurm/v0.0.42/reservations")] = (200, ok({"reservations": [{
        "name": "maint-1", "node_list": "gpu[07-08]", "users": "root,alice",
        "flags": ["MAINT", "IGNORE_JOBS", "SPEC_NODES"],
        "start_time": {"set": True, "infinite": False, "number": 1730000000},
        "end_time": {"set": True, "infinite": True, "number": 0}}]}))
    server.routes[("GET", "/slurm/v0.0.42/diag")] = (200, ok({"statistics": {
        "dbd_agent_queue_size": {"set": True, "infinite": False, "number": 17}}}))


def test_v42_state_arrays_and_number_objects(server: FakeSlurmrestd) -> None:
    serve_v42(server)
    rest = backend(server.url)
    nodes = {n.name: n for n in rest.nodes()}
    assert nodes["gpu07"].drained and nodes["gpu07"].reason_user == "alice"
    assert nodes["gpu07"].reason_time == 1730001000 and nodes["gpu07"].boot_time == 1730000000
    assert 4242 in nodes["gpu08"].jobs
    [job] = [j for j in rest.jobs(["gpu10"]) if j.id == 4242]
    assert job.state == "RUNNING" and job.nodes == ["gpu08", "gpu10"]
    [resv] = rest.reservations()
    assert resv.nodes == ["gpu07", "gpu08"] and resv.users == ["root", "alice"]
    assert resv.end == "Unlimited" and resv.state == "ACTIVE"
    assert resv.start == datetime.fromtimestamp(1730000000).strftime("%Y-%m-%dT%H:%M:%S")
    assert rest.dbd_queue() == 17


def test_a_diag_without_the_dbd_queue_is_a_clear_refusal(server: FakeSlurmrestd) -> None:
    serve_v42(server)
    server.routes[("GET", "/slurm/v0.0.42/diag")] = (200, ok({"statistics": {}}))
    with pytest.raises(SlurmError, match=r"v0.0.42 \(Slurm 24.11\) reports no DBD agent queue"):
        backend(server.url).dbd_queue()


# -- capability and writes ---------------------------------------------------------------

def test_v38_refuses_every_write_naming_the_version_and_what_would_do_it(
        server: FakeSlurmrestd) -> None:
    serve_v38(server)
    rest = backend(server.url)
    assert rest.unsupported("update_nodes") == (
        "slurmrestd v0.0.38 (Slurm 22.05) has no node update (drain/resume); it needs "
        "v0.0.39 (Slurm 23.02) or later, or slurm.backend: cli")
    calls: dict[str, Callable[[], object]] = {
        "update_nodes": lambda: rest.update_nodes(["gpu01"], "DRAIN", "x"),
        "update_features": lambda: rest.update_features(["gpu01"], ["a"]),
        "requeue": lambda: rest.requeue([7]),
        "create_reservation": lambda: rest.create_reservation("r", ["gpu01"], "now", 60, [], []),
        "delete_reservation": lambda: rest.delete_reservation("r"),
        "reboot": lambda: rest.reboot(["gpu01"], "RESUME", "x"),
        "run_on_node": lambda: rest.run_on_node("gpu01", None, ["true"], 10),
        "run_on_nodes": lambda: rest.run_on_nodes(["gpu01", "gpu02"], None, ["true"], 10),
    }
    for operation, call in calls.items():
        reason = rest.unsupported(operation)
        assert reason is not None and "slurm.backend: cli" in reason, operation
        with pytest.raises(SlurmError) as caught:
            call()
        assert str(caught.value) == reason
    assert server.sent("POST") == [] and server.sent("DELETE") == []
    for read in ("nodes", "jobs", "reservations", "accounting", "accounts", "dbd_queue"):
        assert rest.unsupported(read) is None, read
    rest.requeue([])  # nothing to requeue: nothing refused


def test_v42_updates_nodes_one_request_each_with_state_reason_and_features(
        server: FakeSlurmrestd) -> None:
    serve_v42(server, "POST /slurm/v0.0.42/node/{node_name}")
    for name in ("gpu07", "gpu08"):
        server.routes[("POST", f"/slurm/v0.0.42/node/{name}")] = (200, ok({}))
    rest = backend(server.url)
    rest.update_nodes(["gpu07", "gpu08"], "drain", "XID 79")
    rest.update_nodes(["gpu07"], "RESUME")
    rest.update_features(["gpu08"], ["training", "ib"])
    sent = [(r["path"], r["body"]) for r in server.sent("POST")]
    assert sent == [
        ("/slurm/v0.0.42/node/gpu07", {"state": ["DRAIN"], "reason": "XID 79",
                                       "reason_uid": "root"}),
        ("/slurm/v0.0.42/node/gpu08", {"state": ["DRAIN"], "reason": "XID 79",
                                       "reason_uid": "root"}),
        ("/slurm/v0.0.42/node/gpu07", {"state": ["RESUME"]}),
        ("/slurm/v0.0.42/node/gpu08", {"features": "training,ib", "features_act": "training,ib"}),
    ]
    assert "reservation create; it needs v0.0.43 (Slurm 25.05)" in str(
        rest.unsupported("create_reservation"))


def test_a_listing_without_the_endpoint_is_believed_over_the_version(
        server: FakeSlurmrestd) -> None:
    serve_v42(server)  # v0.0.42 listed, but no POST node/{node_name}
    with pytest.raises(SlurmError, match=r"v0.0.42 \(Slurm 24.11\) has no node update"):
        backend(server.url).update_nodes(["gpu07"], "DRAIN", "x")
    assert server.sent("POST") == []


def test_without_a_listing_the_documented_versions_decide(server: FakeSlurmrestd) -> None:
    server.offer("v0.0.40", openapi=False)
    server.routes[("POST", "/slurm/v0.0.40/node/gpu01")] = (200, ok({}))
    rest = backend(server.url)
    rest.update_nodes(["gpu01"], "DRAIN", "x")
    assert [r["path"] for r in server.sent("POST")] == ["/slurm/v0.0.40/node/gpu01"]
    assert "needs v0.0.43" in str(rest.unsupported("delete_reservation"))


def test_v43_creates_and_deletes_reservations(server: FakeSlurmrestd) -> None:
    server.offer("v0.0.43", extra=("POST /slurm/v0.0.43/reservation",
                                   "DELETE /slurm/v0.0.43/reservation/{reservation_name}"))
    server.routes[("POST", "/slurm/v0.0.43/reservation")] = (200, ok({}))
    server.routes[("DELETE", "/slurm/v0.0.43/reservation/grb-maint")] = (200, ok({}))
    rest = backend(server.url)
    rest.create_reservation("grb-maint", ["gpu01", "gpu02", "gpu03"], "2030-01-02T03:04:05",
                            90, ["maint", "IGNORE_JOBS"], ["root", "alice"])
    rest.delete_reservation("grb-maint")
    [post] = server.sent("POST")
    assert post["body"] == {
        "name": "grb-maint", "node_list": "gpu[01-03]", "users": "root,alice",
        "start_time": {"set": True, "infinite": False,
                       "number": int(datetime(2030, 1, 2, 3, 4, 5).timestamp())},
        "duration": {"set": True, "infinite": False, "number": 2},
        "flags": ["MAINT", "IGNORE_JOBS"]}
    assert [r["path"] for r in server.sent("DELETE")] == [
        "/slurm/v0.0.43/reservation/grb-maint"]
    with pytest.raises(SlurmError, match="cannot be sent to slurmrestd as a name"):
        rest.delete_reservation("../nodes")


def test_v45_requeues_one_get_per_job_and_reports_the_jobs_it_could_not(
        server: FakeSlurmrestd) -> None:
    server.offer("v0.0.44", "v0.0.45", extra=("GET /slurm/v0.0.45/job/{job_id}/requeue",))
    done = {"status": [{"job_id": 7, "step_id": "batch", "error_code": 0, "error": "",
                        "why": ""}]}
    refused = {"status": [{"job_id": 8, "error_code": 2017,
                           "error": "Requested operation is presently disabled"}]}
    server.routes[("GET", "/slurm/v0.0.45/job/7/requeue")] = (200, ok(done))
    server.routes[("GET", "/slurm/v0.0.45/job/8/requeue")] = (200, ok(refused))
    rest = backend(server.url)
    assert rest.api_version == "v0.0.45" and rest.unsupported("requeue") is None
    rest.requeue([7])
    with pytest.raises(SlurmError, match="did not requeue 8: Requested operation is presently"):
        rest.requeue([7, 8])
    assert [r["path"] for r in server.sent("GET")][-3:] == [
        "/slurm/v0.0.45/job/7/requeue", "/slurm/v0.0.45/job/7/requeue",
        "/slurm/v0.0.45/job/8/requeue"]


def test_v44_has_no_requeue_naming_the_version_that_does(server: FakeSlurmrestd) -> None:
    server.offer("v0.0.44")
    assert backend(server.url).unsupported("requeue") == (
        "slurmrestd v0.0.44 (Slurm 25.11) has no job requeue; it needs v0.0.45 (Slurm 26.05) "
        "or later, or slurm.backend: cli")


@pytest.mark.parametrize(("release", "version", "refused"), [
    ("24.11", "v0.0.42", {"requeue", "create_reservation", "delete_reservation"}),
    ("26.05", "v0.0.45", set()),
])
def test_the_writes_a_real_listing_offers(server: FakeSlurmrestd, release: str, version: str,
                                          refused: set[str]) -> None:
    # the method/path pairs of that release's own /openapi/v3 (24.11: v0.0.40-42; 26.05:
    # v0.0.42-45); no release has a reboot or srun endpoint
    listed = fixture(f"slurmrestd-{release}-openapi-paths.json")
    server.routes[("GET", "/openapi/v3")] = (200, {"openapi": "3.0.3", "paths": listed})
    rest = backend(server.url)
    assert rest.api_version == version
    found = {op for op in ("update_nodes", "update_features", "requeue", "create_reservation",
                           "delete_reservation", "dbd_queue", "reboot", "run_on_node")
             if rest.unsupported(op) is not None}
    assert found == refused | {"reboot", "run_on_node"}


def test_a_token_slurmctld_refuses_is_said_so(server: FakeSlurmrestd) -> None:
    # 24.11+ passes the token on: slurmctld's SLURM_PROTOCOL_AUTHENTICATION_ERROR, HTTP 500
    server.offer("v0.0.42")
    server.routes[("GET", "/slurm/v0.0.42/nodes")] = (500, {"errors": [{
        "description": "Failure to query nodes", "error_number": 1007,
        "error": "Protocol authentication error", "source": "_dump_nodes"}]})
    with pytest.raises(SlurmError, match="Slurm refuses the token of user root") as caught:
        backend(server.url).nodes(with_jobs=False)
    assert not isinstance(caught.value, SlurmctldUnreachable)


# -- errors ---------------------------------------------------------------------------------

def test_connection_refused_names_the_url(server: FakeSlurmrestd) -> None:
    url = server.url
    server.close()
    with pytest.raises(SlurmError, match=f"cannot connect to slurmrestd at {url}.*refused"):
        backend(url).nodes()


def test_a_slow_server_times_out_after_slurm_timeout(server: FakeSlurmrestd) -> None:
    server.offer("v0.0.38")

    def slow(_: dict[str, Any]) -> tuple[int, Any]:
        time.sleep(3)
        return 200, ok({"nodes": []})

    server.routes[("GET", "/slurm/v0.0.38/nodes")] = slow
    with pytest.raises(SlurmError, match=r"did not answer GET /slurm/v0.0.38/nodes within 2s"):
        backend(server.url).nodes(with_jobs=False)  # the answer would come after 3 s


def test_a_refused_token_is_retried_once_then_reported_without_the_token(
        server: FakeSlurmrestd) -> None:
    server.offer("v0.0.38")
    server.routes[("GET", "/slurm/v0.0.38/nodes")] = (401, "Authentication failure")
    token = mint(b"other key", "root", 3600, time.time())
    with pytest.raises(SlurmError, match=r"refused the token of user root .HTTP 401") as caught:
        backend(server.url, token).nodes(with_jobs=False)
    assert token not in str(caught.value)
    assert [r["path"] for r in server.requests].count("/slurm/v0.0.38/nodes") == 2


def test_slurmctld_down_in_slurms_words_or_by_ping(server: FakeSlurmrestd) -> None:
    server.offer("v0.0.42")
    down = {"errors": [{"error": "Unable to contact slurm controller (connect failure)",
                        "error_number": 1800}]}
    server.routes[("GET", "/slurm/v0.0.42/nodes")] = (500, down)
    rest = backend(server.url)
    with pytest.raises(SlurmctldUnreachable, match="slurmctld is not answering"):
        rest.nodes(with_jobs=False)
    # 22.05: "Unspecified error" and a ping that is not UP
    vague = {"errors": [{"error": "Unspecified error", "error_number": -1}]}
    server.routes[("GET", "/slurm/v0.0.42/nodes")] = (500, vague)
    server.routes[("GET", "/slurm/v0.0.42/ping")] = (500, vague)
    server.routes[("GET", "/slurmdb/v0.0.42/diag")] = (200, ok({"statistics": {}}))
    with pytest.raises(SlurmctldUnreachable, match="check that slurmctld runs"):
        rest.nodes(with_jobs=False)
    # slurmdbd refuses too: a token Slurm does not accept (22.05 passes it through)
    server.routes[("GET", "/slurmdb/v0.0.42/diag")] = (500, vague)
    with pytest.raises(SlurmError, match="Slurm refuses the token") as caught:
        rest.nodes(with_jobs=False)
    assert not isinstance(caught.value, SlurmctldUnreachable)
    server.routes[("GET", "/slurm/v0.0.42/ping")] = (200, ok({"pings": [{"ping": "UP"}]}))
    with pytest.raises(SlurmError, match=r"failed \(HTTP 500, Unspecified error") as caught:
        rest.nodes(with_jobs=False)
    assert not isinstance(caught.value, SlurmctldUnreachable)


def test_errors_in_a_200_answer_and_a_non_json_5xx(server: FakeSlurmrestd) -> None:
    server.offer("v0.0.42")
    server.routes[("GET", "/slurmdb/v0.0.42/accounts")] = (200, {"errors": [
        {"error": "Unable to connect to database", "error_number": 7000}], "accounts": []})
    server.routes[("GET", "/slurm/v0.0.42/reservations")] = (502, "<html>Bad Gateway</html>")
    rest = backend(server.url)
    with pytest.raises(SlurmError, match="slurmdbd is not answering"):
        rest.accounts()
    with pytest.raises(SlurmError, match="HTTP 502 and no JSON object") as caught:
        rest.reservations()
    assert "Bad Gateway" in str(caught.value)


# -- tokens ----------------------------------------------------------------------------------

class Clock:
    def __init__(self, now: float = 1_800_000_000) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_minted_token_is_slurms_hs256_and_renewed_before_it_expires(tmp_path: Path) -> None:
    import base64
    import hashlib
    import hmac

    key = tmp_path / "jwt.key"
    key.write_bytes(KEY)
    clock = Clock()
    source = TokenSource(config("http://x", key_file=str(key), token_lifespan=600).rest,
                         clock=clock)
    first = source.token()
    header, payload, signature = first.split(".")
    expected = hmac.new(KEY, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    assert base64.urlsafe_b64decode(signature + "==") == expected
    assert claims(first) == {"exp": clock.now + 600, "iat": clock.now, "sun": "root"}
    clock.now += 539  # renewal window: 10% of 600 s = 60 s before exp
    assert source.token() == first
    clock.now += 2
    second = source.token()
    assert second != first and claims(second)["exp"] == clock.now + 600
    assert source.headers() == {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": second}


def test_a_token_file_is_reread_before_expiry_and_an_expired_one_is_refused(
        tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "token"
    first = mint(KEY, "root", 7200, clock.now)
    path.write_text(f"SLURM_JWT={first}\n")
    source = TokenSource(config("http://x", token_file=str(path)).rest, clock=clock)
    assert source.token() == first
    second = mint(KEY, "root", 7200, clock.now + 100)
    path.write_text(second)
    clock.now += 7200 - 61  # still outside the 60 s window: the cached token
    assert source.token() == first
    clock.now += 2
    assert source.token() == second
    clock.now += 7200
    with pytest.raises(SlurmError, match=f"from the file {path} expired at .* UTC.*"
                                         "scontrol token username=root") as caught:
        source.token()
    assert second not in str(caught.value)


def test_token_from_the_environment_and_the_missing_sources(tmp_path: Path) -> None:
    token = mint(KEY, "root", 3600, time.time())
    source = TokenSource(config("http://x").rest, environ={"SLURM_JWT": token})
    assert source.token() == token
    with pytest.raises(SlurmError, match="no slurmrestd token in the environment variable"):
        TokenSource(config("http://x").rest, environ={}).token()
    with pytest.raises(SlurmError, match="cannot read the slurmrestd token file"):
        TokenSource(config("http://x", token_file=str(tmp_path / "none")).rest).token()
    with pytest.raises(SlurmError, match="cannot read the JWT key"):
        TokenSource(config("http://x", key_file=str(tmp_path / "none")).rest).token()
    assert claims("not-a-jwt") == {} and claims("a.b.c") == {}


def test_a_refused_token_makes_the_file_be_read_again(server: FakeSlurmrestd,
                                                     tmp_path: Path) -> None:
    server.offer("v0.0.38")
    good = mint(KEY, "root", 3600, time.time())
    path = tmp_path / "token"
    path.write_text(mint(b"stale key", "root", 3600, time.time()))

    def nodes(seen: dict[str, Any]) -> tuple[int, Any]:
        if seen["headers"].get("X-SLURM-USER-TOKEN") != good:
            return 401, "Authentication failure"
        return 200, ok({"nodes": []})

    server.routes[("GET", "/slurm/v0.0.38/nodes")] = nodes
    server.routes[("GET", "/openapi/v3")] = lambda seen: (200, {"paths": {
        "/slurm/v0.0.38/ping": {"get": {}}}})
    rest = RestBackend(config(server.url, token_file=str(path)))
    rest.api_version  # noqa: B018 - discovery, with the stale token (the fake lets it in)
    path.write_text(good)
    assert rest.nodes(with_jobs=False) == []


# -- configuration ---------------------------------------------------------------------------

@pytest.mark.parametrize(("rest", "message"), [
    ({}, "needs slurm.rest.url and slurm.rest.user"),
    ({"url": "http://x", "user": "root"}, "exactly one of .* \\(found 0: none\\)"),
    ({"url": "http://x", "user": "root", "token_env": "T", "key_file": "/k"},
     "found 2: token_env, key_file"),
    ({"url": "ftp://x", "user": "root", "token_env": "T"}, "url"),
    ({"url": "http://x", "user": "root", "token_env": "T", "api_version": "v0.0.37"},
     "api_version"),
    ({"url": "http://x", "user": "root", "token_env": "T", "password": "p"}, "password"),
])
def test_the_rest_section_is_validated(rest: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SlurmConfig.model_validate({"backend": "rest", "rest": rest})
    SlurmConfig.model_validate({"backend": "cli"})  # the cli backend needs none of it
