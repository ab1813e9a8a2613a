"""Who may see the console (bot.surfaces.console.identity), tried the way the world will:
a proxy's header believed only from its addresses (real connections from 127.0.0.1 and
127.0.0.2), sent twice, by email; basic with every malformed Authorization; no identity
set up; roles (403); the 401 challenge only with basic; forms from another origin."""

from __future__ import annotations

import base64
import http.client
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from starlette.responses import PlainTextResponse, Response

from bot.config import Config, ConsoleConfig, ProxyIdentity
from bot.runtime.httpserver import HttpServer
from bot.runtime.serving import application, http_settings
from bot.surfaces.console import pages
from bot.surfaces.console.app import SECURITY_HEADERS, Ask, Console, _same_origin
from bot.surfaces.console.identity import REALM, Identities, NotAllowed, Viewer
from bot.surfaces.console.passwords import hash_password
from tests.conftest import LAB_USERS, BotFactory, lab_config

PASSWORD = "alice's console password"
USERS = {**LAB_USERS, "erin": {"groups": ["audit"]}, "eve": {"groups": []}}
AUDITORS = ["group:audit", "user:carol"]
TRUSTED = ["127.0.0.1/32", "10.20.0.0/16", "::1"]
TIMEOUT = 10.0


@pytest.fixture(scope="module")
def hashed() -> str:
    return hash_password(PASSWORD)


def config(**console: Any) -> Config:
    return lab_config("sqlite://", Path("."), users=USERS,
                      console={"auditors": AUDITORS, **console})


def basic(name: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{name}:{password}".encode()).decode()
    return {"authorization": f"Basic {token}"}


def refusal(identities: Identities, headers: dict[str, str],
            client: str | None = "127.0.0.1") -> NotAllowed:
    with pytest.raises(NotAllowed) as raised:
        identities.who(headers, client)
    return raised.value


# --- the proxy's header ------------------------------------------------------------------


def test_the_proxy_header_is_the_name_only_from_a_trusted_address() -> None:
    who = Identities(config(proxy={"trusted": TRUSTED}))
    header = {"x-forwarded-user": "alice"}
    for trusted in ("127.0.0.1", "10.20.3.4", "::1"):
        assert who.who(header, trusted) == Viewer("alice", auditor=False)
    for client in ("127.0.0.2", "10.21.0.1", "192.168.1.1", "::2", "", None, "not-an-ip",
                   "127.0.0.1, 10.0.0.1"):
        problem = refusal(who, header, client)
        assert problem.status == 401, client
        assert "alice" not in str(problem)  # not believed, so not repeated as a name
        assert "proxy" in str(problem)


def test_from_an_untrusted_address_the_header_is_ignored_and_basic_asked(hashed: str) -> None:
    who = Identities(config(proxy={"trusted": TRUSTED}, basic={"alice": hashed}))
    forged = {"x-forwarded-user": "carol"}  # carol is an auditor
    assert refusal(who, forged, "127.0.0.2").status == 401
    assert who.who({**forged, **basic("alice", PASSWORD)}, "127.0.0.2") == Viewer("alice",
                                                                                  False)
    # from the proxy, the proxy's name wins; without it, basic
    assert who.who({**forged, **basic("alice", PASSWORD)}, "127.0.0.1").name == "carol"
    assert who.who(basic("alice", PASSWORD), "127.0.0.1").name == "alice"


@pytest.mark.parametrize("value", ["alice, carol", "alice,carol", "carol,", ",carol"])
def test_a_header_sent_twice_is_refused(value: str) -> None:
    """Two X-Forwarded-User headers arrive joined by ", " (bot.runtime.web.header_map)."""
    problem = refusal(Identities(config(proxy={"trusted": TRUSTED})),
                      {"x-forwarded-user": value})
    assert problem.status == 401 and "more than once" in str(problem)


@pytest.mark.parametrize("value", ["", "   ", "x" * 129, "alice\tcarol", "ali\x00ce", "a\nb"])
def test_an_empty_or_unprintable_or_long_name_is_refused(value: str) -> None:
    problem = refusal(Identities(config(proxy={"trusted": TRUSTED})),
                      {"x-forwarded-user": value})
    assert problem.status == 401


def test_email_mode_takes_the_email_header_and_only_it() -> None:
    who = Identities(config(proxy={"trusted": TRUSTED, "name_from": "email"},
                            auditors=["user:erin@example.com"]))
    both = {"x-forwarded-user": "eve", "x-forwarded-email": "erin@example.com"}
    assert who.who(both, "127.0.0.1") == Viewer("erin@example.com", auditor=True)
    problem = refusal(who, {"x-forwarded-user": "erin@example.com"})
    assert problem.status == 401 and "X-Forwarded-Email" in str(problem)
    doubled = {"x-forwarded-email": "erin@example.com, alice@example.com"}
    assert "more than once" in str(refusal(who, doubled))


def test_the_header_names_are_configurable() -> None:
    who = Identities(config(proxy={"trusted": TRUSTED, "user_header": "Remote-User"},
                            auditors=["*"]))
    assert who.who({"remote-user": "dave"}, "127.0.0.1").name == "dave"
    problem = refusal(who, {"x-forwarded-user": "dave"})
    assert problem.status == 401 and "Remote-User" in str(problem)


@pytest.mark.parametrize("trusted", [["10.0.0.0/33"], ["proxy.example.com"], ["10.0.0.256"],
                                     [""], [], ["127.0.0.1", "::1/129"]])
def test_a_trusted_entry_that_is_no_address_or_network_is_refused(trusted: list[str]) -> None:
    with pytest.raises(ValidationError):
        ProxyIdentity.model_validate({"trusted": trusted})
    with pytest.raises(ValidationError):
        ConsoleConfig.model_validate({"proxy": {"trusted": trusted}})


def test_the_console_configuration_refuses_what_it_does_not_know() -> None:
    wrong: dict[str, Any]
    for wrong in ({"proxy": {"trusted": TRUSTED, "name_from": "cn"}},
                  {"proxy": {"trusted": TRUSTED, "secret": "x"}},
                  {"auditors": ["carol"]}, {"page_size": 0}, {"users": {}}):
        with pytest.raises(ValidationError):
            ConsoleConfig.model_validate(wrong)


# --- HTTP basic --------------------------------------------------------------------------


def test_basic_with_the_right_password_is_the_name(hashed: str) -> None:
    who = Identities(config(basic={"alice": hashed, "carol": hashed}))
    assert who.who(basic("alice", PASSWORD), None) == Viewer("alice", auditor=False)
    assert who.who(basic("carol", PASSWORD), None) == Viewer("carol", auditor=True)
    scheme_case = {"authorization": basic("alice", PASSWORD)["authorization"].replace(
        "Basic", "bAsIc")}
    assert who.who(scheme_case, None).name == "alice"


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


@pytest.mark.parametrize(("authorization", "says"), [
    (None, "sign in"),
    ("", "sign in"),
    ("Basic", "sign in"),
    ("Basic ", "sign in"),
    ("Basic    ", "sign in"),
    (f"Bearer {_b64(b'alice:x')}", "sign in"),
    (f"Basic{_b64(('alice:' + PASSWORD).encode())}", "sign in"),  # no space
    ("Basic not*base64", "not valid basic"),
    (f"Basic {_b64(('alice:' + PASSWORD).encode())[:-2]}", "not valid basic"),  # cut
    ("Basic " + _b64(b"alice:" + PASSWORD.encode("utf-16")), "not valid basic"),  # UTF-16
    ("Basic " + _b64(b"al\xffice:pw"), "not valid basic"),
    (f"Basic {_b64(('alice:' + PASSWORD).encode())}, Basic {_b64(b'bob:x')}",
     "not valid basic"),  # sent twice
    (f"Basic {_b64(b'alice:wrong password')}", "wrong name or password"),
    (f"Basic {_b64(('alice:' + PASSWORD + ' ').encode())}", "wrong name or password"),
    (f"Basic {_b64(('alice:' + PASSWORD + chr(0)).encode())}", "wrong name or password"),
    (f"Basic {_b64(('mallory:' + PASSWORD).encode())}", "wrong name or password"),
    (f"Basic {_b64(('Alice:' + PASSWORD).encode())}", "wrong name or password"),
    (f"Basic {_b64(PASSWORD.encode())}", "wrong name or password"),  # no colon
    (f"Basic {_b64(('broken:' + PASSWORD).encode())}", "wrong name or password"),
    (f"Basic {_b64(b':')}", "wrong name or password"),
    (f"Basic {_b64(b'')}", "sign in"),
])
def test_basic_refuses_with_401(hashed: str, authorization: str | None, says: str) -> None:
    # a hash of the right shape that scrypt refuses (N must be a power of 2)
    broken = "$".join(["scrypt", "3", *hashed.split("$")[2:]])
    who = Identities(config(basic={"alice": hashed, "broken": broken}))
    headers = {} if authorization is None else {"authorization": authorization}
    problem = refusal(who, headers, None)
    assert problem.status == 401 and says in str(problem), str(problem)
    assert PASSWORD not in str(problem)


def test_a_cached_right_password_lets_no_wrong_one_in(hashed: str) -> None:
    who = Identities(config(basic={"alice": hashed, "bob": hashed}))
    for _ in range(2):
        assert who.who(basic("alice", PASSWORD), None).name == "alice"
        assert who.who(basic("bob", PASSWORD), None).name == "bob"
        for wrong in ("", PASSWORD[:-1], PASSWORD + "x", PASSWORD.upper()):
            assert refusal(who, basic("alice", wrong)).status == 401
        assert refusal(who, basic("alice", PASSWORD.replace("alice", "bob"))).status == 401
    cached = list(who._known.items())
    assert all(len(key) == 32 and PASSWORD.encode() not in key for key, _ in cached)
    # what the cache remembers is the whole credential: the name cannot be swapped
    assert sorted(name for _, name in cached) == ["alice", "bob"]


def test_the_cache_keeps_at_most_256_credentials(hashed: str) -> None:
    who = Identities(config(basic={"alice": hashed, "bob": hashed}))
    who.who(basic("alice", PASSWORD), None)
    for index in range(300):  # forged entries: the bound, not scrypt, is under test
        who._known[bytes([index % 256, index // 256]) * 16] = "alice"
    who.who(basic("bob", PASSWORD), None)  # a new one: the oldest go
    assert len(who._known) == 256 and list(who._known.values())[-1] == "bob"


# --- no identity, and roles --------------------------------------------------------------


def test_no_identity_set_up_refuses_everybody_saying_what_to_configure() -> None:
    who = Identities(config())
    for headers in ({}, {"x-forwarded-user": "carol"}, basic("carol", PASSWORD),
                    {"x-forwarded-user": "carol", **basic("carol", PASSWORD)}):
        for client in ("127.0.0.1", "::1", None):
            problem = refusal(who, headers, client)
            assert problem.status == 401
            assert "configure console.proxy or console.basic" in str(problem)


def test_auditors_see_everything_requesters_their_own_and_others_nothing() -> None:
    who = Identities(config(proxy={"trusted": TRUSTED}))
    seen = {name: who.who({"x-forwarded-user": name}, "127.0.0.1")
            for name in ("alice", "bob", "carol", "dave", "erin")}
    assert {name for name, viewer in seen.items() if viewer.auditor} == {"carol", "erin"}
    for name in ("eve", "mallory", "root"):
        problem = refusal(who, {"x-forwarded-user": name})
        assert problem.status == 403
        assert f"{name} is neither an auditor nor a requester" in str(problem)


def test_with_everyone_a_requester_nobody_is_an_auditor_by_default() -> None:
    who = Identities(lab_config("sqlite://", Path("."), users=USERS, requesters=["*"],
                                console={"proxy": {"trusted": TRUSTED}}))
    assert who.who({"x-forwarded-user": "eve"}, "127.0.0.1") == Viewer("eve", auditor=False)


def test_same_origin_compares_origin_with_host() -> None:
    assert _same_origin({"origin": "http://127.0.0.1:8080", "host": "127.0.0.1:8080"})
    assert _same_origin({"origin": "https://bot.example.com", "host": "bot.example.com"})
    for headers in ({}, {"host": "bot.example.com"}, {"origin": "https://bot.example.com"},
                    {"origin": "null", "host": "bot.example.com"},
                    {"origin": "https://evil.example", "host": "bot.example.com"},
                    {"origin": "https://bot.example.com.evil.example",
                     "host": "bot.example.com"},
                    {"origin": "https://bot.example.com:444", "host": "bot.example.com"}):
        assert not _same_origin(headers), headers


# --- through the real server -------------------------------------------------------------


def posted(ask: Ask) -> Response:
    return PlainTextResponse(f"{ask.method} by {ask.viewer.name}")


@contextmanager
def console_server(make_bot: BotFactory, **console: Any) -> Iterator[int]:
    """`runbook serve`'s application with the console (every page, and POST /ui/posted) at
    /ui, on a free loopback port."""
    bot = make_bot({}, users=USERS, console={"auditors": AUDITORS, **console},
                   server={"shutdown_grace_seconds": 1})
    app = Console(bot, [*pages.ROUTES, ("/posted", posted, ("POST",))]).app()
    server = HttpServer(application(bot, alerts_token="t" * 32, mounts={"/ui": app}),
                        "127.0.0.1", 0, http_settings(bot.config.server))
    server.start()
    try:
        yield server.port
    finally:
        server.stop()


def send(port: int, path: str = "/ui/executions", headers: Sequence[tuple[str, str]] = (),
         source: str = "127.0.0.1", method: str = "GET") -> tuple[int, dict[str, str], str]:
    """One request from ``source`` (a real address on loopback), headers sent as given
    (twice when listed twice): status, headers (lower-case names), body."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT,
                                            source_address=(source, 0))
    try:
        connection.putrequest(method, path)
        for name, value in headers:
            connection.putheader(name, value)
        connection.putheader("Content-Length", "0")
        connection.endheaders()
        with connection.getresponse() as response:
            return (response.status, {k.lower(): v for k, v in response.getheaders()},
                    response.read().decode())
    finally:
        connection.close()


@pytest.mark.parametrize(("console", "challenge", "says"), [
    ({"basic": "hashed"}, True, "sign in with your console name and password"),
    ({"proxy": {"trusted": ["127.0.0.1"]}}, False, "the proxy sent no X-Forwarded-User"),
    ({}, False, "configure console.proxy or console.basic")])
def test_401_challenges_for_basic_only(make_bot: BotFactory, hashed: str,
                                       console: dict[str, Any], challenge: bool,
                                       says: str) -> None:
    if console.get("basic"):
        console = {"basic": {"alice": hashed}}
    with console_server(make_bot, **console) as port:
        status, headers, body = send(port)
        wrong = send(port, headers=list(basic("alice", "wrong password").items()))
    assert status == 401 and says in body
    assert (headers.get("www-authenticate") == REALM) is challenge
    assert ("www-authenticate" in wrong[1]) is challenge and wrong[0] == 401
    assert headers["content-type"].startswith("text/html")
    for name, value in SECURITY_HEADERS.items():
        assert headers[name.lower()] == value


def test_the_proxy_header_over_real_connections(make_bot: BotFactory) -> None:
    """Trusted 127.0.0.1 only: a connection from 127.0.0.2 is not the proxy, whatever it
    says about itself (uvicorn's proxy headers are off)."""
    with console_server(make_bot, proxy={"trusted": ["127.0.0.1/32"]}) as port:
        proxied = send(port, headers=[("X-Forwarded-User", "alice")])
        forged = [send(port, headers=[("X-Forwarded-User", "carol"), *spoof],
                       source="127.0.0.2")
                  for spoof in ([], [("X-Forwarded-For", "127.0.0.1")],
                                [("Forwarded", "for=127.0.0.1")], [("X-Real-IP", "127.0.0.1")])]
        twice = send(port, headers=[("X-Forwarded-User", "alice"),
                                    ("X-Forwarded-User", "carol")])
        eve = send(port, headers=[("X-Forwarded-User", "eve")])
        # CGI would read it as X-Forwarded-User: a proxy that strips the one may pass this
        underscored = send(port, headers=[("X_Forwarded_User", "carol")])
        spoofed_from_proxy = send(port, headers=[("X-Forwarded-User", "alice"),
                                                 ("X-Forwarded-For", "10.9.9.9")])
    assert proxied[0] == 200 and "alice" in proxied[2] and "auditor" not in proxied[2]
    for status, headers, body in forged:
        assert status == 401 and "carol" not in body and "www-authenticate" not in headers
    assert twice[0] == 401 and "more than once" in twice[2]
    assert eve[0] == 403 and "eve is neither an auditor nor a requester" in eve[2]
    assert spoofed_from_proxy[0] == 200
    assert underscored[0] == 401 and "the proxy sent no X-Forwarded-User" in underscored[2]


def test_basic_over_real_connections(make_bot: BotFactory, hashed: str) -> None:
    with console_server(make_bot, basic={"alice": hashed, "eve": hashed}) as port:
        right = send(port, headers=list(basic("alice", PASSWORD).items()))
        again = send(port, headers=list(basic("alice", PASSWORD).items()))
        wrong = send(port, headers=list(basic("alice", PASSWORD + "!").items()))
        eve = send(port, headers=list(basic("eve", PASSWORD).items()))
        twice = send(port, headers=[*basic("alice", PASSWORD).items(),
                                    *basic("alice", PASSWORD).items()])
    assert right[0] == again[0] == 200 and "alice" in right[2]
    assert wrong[0] == 401 and wrong[1]["www-authenticate"] == REALM
    assert eve[0] == 403 and "www-authenticate" not in eve[1]
    assert twice[0] == 401


def test_a_form_from_another_origin_is_refused(make_bot: BotFactory) -> None:
    with console_server(make_bot, proxy={"trusted": ["127.0.0.1"]}) as port:
        def post(*headers: tuple[str, str], user: str = "alice") -> tuple[int, str]:
            status, _, body = send(port, "/ui/posted", [("X-Forwarded-User", user), *headers],
                                   method="POST")
            return status, body

        home = f"127.0.0.1:{port}"
        same = post(("Origin", f"http://{home}"))
        no_origin = post()
        elsewhere = [post(("Origin", origin)) for origin in (
            "http://evil.example", "null", f"http://{home}.evil.example",
            f"http://127.0.0.1:{port + 1}")]
        nobody = send(port, "/ui/posted", [("Origin", f"http://{home}")], method="POST")
    assert same == (200, "POST by alice")
    for status, body in [no_origin, *elsewhere]:
        assert status == 403 and "must be sent from the console" in body
    assert nobody[0] == 401  # who is asking comes first


def test_wrong_passwords_do_not_hold_up_the_server(make_bot: BotFactory, hashed: str) -> None:
    """scrypt is slow on purpose; it must not be slow for everybody else: while wrong
    passwords are tried, /healthz still answers at once."""
    with console_server(make_bot, basic={"alice": hashed}) as port:
        stop = threading.Event()
        refused = [threading.Event() for _ in range(4)]  # each guesser's first one answered

        def guess(number: int) -> None:
            attempt = 0
            while not stop.is_set():
                attempt += 1
                send(port, headers=list(basic("alice", f"guess {attempt}").items()))
                refused[number].set()

        guessers = [threading.Thread(target=guess, args=(n,)) for n in range(4)]
        for thread in guessers:
            thread.start()
        try:
            assert all(first.wait(TIMEOUT) for first in refused)  # all four are guessing
            waits = []
            for _ in range(10):
                started = time.monotonic()
                assert send(port, "/healthz")[0] == 200
                waits.append(time.monotonic() - started)
        finally:
            stop.set()
            for thread in guessers:
                thread.join(TIMEOUT)
    assert sorted(waits)[len(waits) // 2] < 0.15, waits  # unprotected: 0.3 s to 0.8 s
