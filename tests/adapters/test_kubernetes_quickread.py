"""The quick Kubernetes reader (adapters/kubernetes/quickread.py) against the lab's fake API
server, in process, over HTTP and HTTPS: for each kubeconfig it handles (token, token file,
CA and client certificate as files or data, insecure-skip-tls-verify, tls-server-name) and
the in-cluster service account, it sends the official client's requests (same paths, same
headers) and gives the same records and errors; any other setting gets the official client."""

from __future__ import annotations

import base64
import shutil
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import yaml

from adapters.kubernetes import access as access_module
from adapters.kubernetes.backend import KubernetesError
from adapters.kubernetes.client import ClientBackend
from adapters.kubernetes.config import KubernetesConfig
from adapters.kubernetes.quickread import USER_AGENT, QuickReader
from adapters.kubernetes.reading import make_reader
from tests.lab.fixture import REPO

sys.path.insert(0, str(REPO / "deploy" / "lab"))
from kubeapi.cluster import Cluster, Timing
from kubeapi.faults import FaultSwitch
from kubeapi.seed import seed
from kubeapi.server import ApiServer, Handler
from kubeapi.store import Store

OPENSSL = shutil.which("openssl")
needs_openssl = pytest.mark.skipif(OPENSSL is None, reason="openssl (to make test certificates) "
                                                           "is not installed")


@dataclass
class FakeApi:
    url: str
    server: ApiServer
    seen: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)


@dataclass(frozen=True)
class Certs:
    folder: Path

    def __getitem__(self, name: str) -> Path:
        return self.folder / name


def serve(tls: ssl.SSLContext | None = None) -> FakeApi:
    cluster = Cluster(Store(), Timing())
    seed(cluster, ["gpu05", "gpu06"], "550.54.15")
    server = ApiServer(("127.0.0.1", 0), cluster, FaultSwitch(None))
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    api = FakeApi(f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}",
                  server)

    class Recording(Handler):  # what each request carried, to compare the two clients
        def parse_request(self) -> bool:
            parsed = BaseHTTPRequestHandler.parse_request(self)
            if parsed:
                api.seen.append((self.command, self.path, dict(self.headers.items())))
            return parsed

    server.RequestHandlerClass = Recording
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    return api


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """A CA, a server certificate for 127.0.0.1 and kube.test, a client certificate."""
    if OPENSSL is None:
        pytest.skip("openssl (to make test certificates) is not installed")
    folder = tmp_path_factory.mktemp("certs")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    (folder / "san").write_text("subjectAltName=IP:127.0.0.1,DNS:kube.test\n")
    steps = [["req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
              "-subj", "/CN=test-ca"]]
    for who in ("server", "client"):
        steps += [["req", *ec, "-keyout", f"{who}.key", "-out", f"{who}.csr",
                   "-subj", f"/CN={who}"],
                  ["x509", "-req", "-in", f"{who}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                   "-CAcreateserial", "-out", f"{who}.crt", "-days", "2",
                   *(["-extfile", "san"] if who == "server" else [])]]
    for step in steps:
        subprocess.run([str(OPENSSL), *step], cwd=folder, check=True, capture_output=True)
    return Certs(folder)


@pytest.fixture
def http_api() -> Iterator[FakeApi]:
    api = serve()
    yield api
    api.server.shutdown()
    api.server.server_close()


@pytest.fixture
def https_api(certs: Certs) -> Iterator[FakeApi]:
    """HTTPS that asks for a client certificate signed by the CA (and takes none too)."""
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(certs["server.crt"], certs["server.key"])
    tls.load_verify_locations(certs["ca.crt"])
    tls.verify_mode = ssl.CERT_OPTIONAL
    api = serve(tls)
    yield api
    api.server.shutdown()
    api.server.server_close()


def kubeconfig(folder: Path, server: str, user: dict[str, Any] | None,
               **cluster: Any) -> str:
    path = folder / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "lab",
        "clusters": [{"name": "lab", "cluster": {"server": server + "/", **cluster}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "me"}}],
        "users": [] if user is None else [{"name": "me", "user": user}]}))
    return str(path)


def reads(backend: Any) -> list[Any]:
    """What the node view and the inventory read, and a 404's error."""
    got: list[Any] = [backend.list_nodes("nvidia.com/gpu.present=true"), backend.list_nodes(),
                      backend.get_node("gpu05"), backend.pods_on_node("gpu05"),
                      backend.list_pods(),
                      backend.list_pods(namespace="serving", label_selector="app=inference")]
    with pytest.raises(KubernetesError) as missing:
        backend.get_node("no-such-node")
    err = missing.value
    return [*got, (type(err), str(err), err.status, err.reason, err.api_message, err.request)]


def same_as_official(config: KubernetesConfig, api: FakeApi) -> QuickReader:
    """The quick reader's reads and requests equal the official client's."""
    quick = make_reader(config)
    assert isinstance(quick, QuickReader)
    official = ClientBackend(config)
    try:
        api.seen.clear()
        got = reads(quick)
        quick_seen, api.seen[:] = list(api.seen), []
        assert got == reads(official) and len(got[0]) == 3  # the fake's GPU nodes
        assert api.seen == quick_seen  # paths, queries, every header
    finally:
        quick.close()
        official.close()
    return quick


def b64(path: Path) -> str:
    return base64.standard_b64encode(path.read_bytes()).decode()


def test_a_token_or_a_token_file_over_http(tmp_path: Path, http_api: FakeApi) -> None:
    config = KubernetesConfig(kubeconfig=kubeconfig(tmp_path, http_api.url, {"token": "t0k"}))
    same_as_official(config, http_api)
    (tmp_path / "token").write_text("from-a-file")
    config = KubernetesConfig(kubeconfig=kubeconfig(tmp_path, http_api.url,
                                                    {"tokenFile": "token"}))
    quick = same_as_official(config, http_api)
    quick.list_nodes()
    assert http_api.seen[-1][2]["authorization"] == "Bearer from-a-file"
    assert http_api.seen[-1][2]["User-Agent"] == USER_AGENT


@needs_openssl
@pytest.mark.parametrize("as_data", [False, True], ids=["files", "data"])
def test_a_ca_and_a_client_certificate_over_https(tmp_path: Path, https_api: FakeApi,
                                                  certs: Certs, as_data: bool) -> None:
    for name in ("ca.crt", "client.crt", "client.key"):
        shutil.copy(certs[name], tmp_path / name)  # relative to the kubeconfig's folder
    if as_data:
        user = {"client-certificate-data": b64(certs["client.crt"]),
                "client-key-data": b64(certs["client.key"]), "token": "t"}
        cluster = {"certificate-authority-data": b64(certs["ca.crt"])}
    else:
        user = {"client-certificate": "client.crt", "client-key": "client.key", "token": "t"}
        cluster = {"certificate-authority": "ca.crt"}
    config = KubernetesConfig(kubeconfig=kubeconfig(tmp_path, https_api.url, user, **cluster))
    quick = same_as_official(config, https_api)
    assert quick.access.cert_file is not None and Path(quick.access.cert_file).is_file()
    server_name = KubernetesConfig(kubeconfig=kubeconfig(
        tmp_path, https_api.url, user, **cluster, **{"tls-server-name": "kube.test"}))
    assert same_as_official(server_name, https_api).access.server_name == "kube.test"


@needs_openssl
@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_insecure_skip_tls_verify_and_a_wrong_ca(tmp_path: Path, https_api: FakeApi,
                                                 certs: Certs) -> None:
    insecure = KubernetesConfig(kubeconfig=kubeconfig(
        tmp_path, https_api.url, {"token": "t"}, **{"insecure-skip-tls-verify": True}))
    assert same_as_official(insecure, https_api).access.verify is False
    nobody = KubernetesConfig(kubeconfig=kubeconfig(  # a context whose user is not listed
        tmp_path, https_api.url, None, **{"certificate-authority": str(certs["ca.crt"])}))
    assert same_as_official(nobody, https_api).access.authorization is None
    wrong_ca = KubernetesConfig(request_timeout=3, kubeconfig=kubeconfig(
        tmp_path, https_api.url, {"token": "t"}, **{"certificate-authority": str(
            certs["client.crt"])}))
    errors = []
    for backend in (make_reader(wrong_ca), ClientBackend(wrong_ca)):
        with pytest.raises(KubernetesError) as refused:
            backend.list_nodes()
        errors.append((type(refused.value), str(refused.value)))
    assert errors[0] == errors[1] and "CERTIFICATE_VERIFY_FAILED" in errors[0][1]


def test_an_api_that_does_not_answer_is_the_same_error(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nobody listens on once it is closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = KubernetesConfig(request_timeout=2, kubeconfig=kubeconfig(
        tmp_path, f"http://127.0.0.1:{port}", {"token": "t"}))
    errors = []
    for backend in (make_reader(config), ClientBackend(config)):
        with pytest.raises(KubernetesError) as down:
            backend.get_node("gpu05")
        errors.append((type(down.value), str(down.value), down.value.reason))
    assert errors[0] == errors[1] and "not answering" in errors[0][1]


@needs_openssl
def test_the_in_cluster_service_account_reread_each_minute(
        tmp_path: Path, https_api: FakeApi, certs: Certs,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes.config import incluster_config

    shutil.copy(certs["ca.crt"], tmp_path / "ca.crt")
    (tmp_path / "token").write_text("first")
    monkeypatch.setattr(access_module, "SERVICE_ACCOUNT", str(tmp_path))
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(tmp_path / "token"))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(tmp_path / "ca.crt"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", https_api.url.rsplit(":", 1)[1])
    quick = same_as_official(KubernetesConfig(), https_api)
    (tmp_path / "token").write_text("second")
    quick.list_nodes()
    assert https_api.seen[-1][2]["authorization"] == "bearer first"  # within the minute
    quick.access.read_at -= access_module.TOKEN_REREAD
    quick.list_nodes()
    assert https_api.seen[-1][2]["authorization"] == "bearer second"


EXEC_PLUGIN = """#!/bin/sh
echo '{"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential",
       "status": {"token": "from-exec"}}'
"""


def test_other_settings_get_the_official_client(tmp_path: Path, http_api: FakeApi,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = tmp_path / "plugin"
    plugin.write_text(EXEC_PLUGIN)
    plugin.chmod(0o755)
    execs = KubernetesConfig(kubeconfig=kubeconfig(tmp_path, http_api.url, {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1beta1", "command": str(plugin)}}))
    backend = make_reader(execs)
    assert isinstance(backend, ClientBackend)
    backend.list_nodes()
    assert http_api.seen[-1][2]["authorization"] == "Bearer from-exec"
    for user in ({"username": "u", "password": "p"},
                 {"auth-provider": {"name": "oidc", "config": {"id-token": "x"}}}):
        path = kubeconfig(tmp_path, http_api.url, user)
        assert isinstance(make_reader(KubernetesConfig(kubeconfig=path)), ClientBackend)
    token = kubeconfig(tmp_path, http_api.url, {"token": "t"})
    two_files = KubernetesConfig(kubeconfig=f"{token}:{tmp_path / 'other'}")
    assert isinstance(make_reader(two_files), ClientBackend)
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    assert isinstance(make_reader(KubernetesConfig(kubeconfig=token)), ClientBackend)


def test_a_configuration_it_cannot_read_is_the_official_error(tmp_path: Path) -> None:
    missing = KubernetesConfig(kubeconfig=str(tmp_path / "nowhere"))
    with pytest.raises(KubernetesError, match="cannot configure the Kubernetes client from "
                                              "kubeconfig"):
        make_reader(missing)
    (tmp_path / "broken").write_text("clusters: [{}]\ncurrent-context: lab\n")
    with pytest.raises(KubernetesError, match="Invalid kube-config"):
        make_reader(KubernetesConfig(kubeconfig=str(tmp_path / "broken")))
    null_user = yaml.safe_load(Path(kubeconfig(tmp_path, "http://127.0.0.1:9", {})).read_text())
    null_user["users"][0]["user"] = None
    (tmp_path / "null-user").write_text(yaml.safe_dump(null_user))
    with pytest.raises(KubernetesError, match="Expected key user"):
        make_reader(KubernetesConfig(kubeconfig=str(tmp_path / "null-user")))
    (tmp_path / "not-yaml").write_text("clusters: [\n")
    raised = []
    for make in (make_reader, ClientBackend):
        with pytest.raises(yaml.YAMLError) as failed:  # as the official client raises it
            make(KubernetesConfig(kubeconfig=str(tmp_path / "not-yaml")))
        raised.append((type(failed.value), str(failed.value)))
    assert raised[0] == raised[1]


def test_a_context_by_name(tmp_path: Path, http_api: FakeApi) -> None:
    path = kubeconfig(tmp_path, http_api.url, {"token": "t"})
    assert isinstance(make_reader(KubernetesConfig(kubeconfig=path, context="lab")),
                      QuickReader)
    with pytest.raises(KubernetesError, match="Expected object with name other"):
        make_reader(KubernetesConfig(kubeconfig=path, context="other"))


def test_the_user_agent_is_the_official_clients() -> None:
    from kubernetes import client

    assert client.ApiClient().user_agent == USER_AGENT
