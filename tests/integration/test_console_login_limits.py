"""Limits on password guesses, over real HTTP against the console served in this process, whose
clock the test moves (nothing sleeps)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from ipaddress import ip_network

import pytest
from sqlalchemy import Engine

from notifier.console.auth import hash_password
from notifier.console.gate import Gate
from notifier.console.site import create_app
from notifier.specs import parse_users
from tests.console_server import USERS, Client, Clock, free_port, serving

#: carol's hash is a costly one (64 MiB, a few hundred ms a check): a guess that ran scrypt
#: shows in the time it took.
CAROL = "carol-secret"

Start = Callable[..., str]


@pytest.fixture(scope="module")
def carol() -> str:
    return f"carol:{hash_password(CAROL, n=2**16)}:viewer"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def start(engine: Engine, clock: Clock, carol: str) -> Iterator[Start]:
    """Serve a console (``proxies``: the trusted ones); its base URL."""

    def run(proxies: tuple[str, ...] = ()) -> str:
        port = free_port()
        gate = Gate.loopback(port, proxies=[ip_network(p) for p in proxies])
        app = create_app(engine, parse_users(f"{USERS},{carol}"), gate=gate, clock=clock)
        return stack.enter_context(serving(app, port))

    with ExitStack() as stack:
        yield run


@pytest.fixture
def clients() -> Iterator[Callable[..., Client]]:
    made: list[Client] = []

    def make(url: str, address: str = "127.0.0.1") -> Client:
        made.append(Client(url, address))
        return made[-1]

    yield make
    for c in made:
        c.http.close()


def wait_of(r: object) -> int:
    assert r.status_code == 429, r.text  # type: ignore[attr-defined]
    return int(r.headers["retry-after"])  # type: ignore[attr-defined]


def test_a_failing_client_waits_longer_each_time_up_to_30_s(
    start: Start, clients: Callable[..., Client], clock: Clock
) -> None:
    guesser = clients(start())
    assert [guesser.try_login("alice", f"g{i}").status_code for i in range(5)] == [401] * 5
    waits = []
    for i in range(8):
        waits.append(wait_of(guesser.try_login("alice", "alice-secret")))  # even the right one
        assert wait_of(guesser.try_login("alice", f"h{i}")) == waits[-1]  # counted once
        clock.advance(waits[-1])
        assert guesser.try_login("alice", f"h{i}").status_code == 401
    assert waits == [1, 2, 4, 8, 16, 30, 30, 30]
    clock.advance(30)
    assert guesser.try_login("alice", "alice-secret").status_code == 303
    # a login starts the client and the name afresh
    assert [guesser.try_login("alice", f"k{i}").status_code for i in range(5)] == [401] * 5


def test_a_refused_guess_runs_no_scrypt(start: Start, clients: Callable[..., Client]) -> None:
    guesser = clients(start())
    checked = []
    for i in range(5):
        began = time.perf_counter()
        assert guesser.try_login("carol", f"g{i}").status_code == 401
        checked.append(time.perf_counter() - began)
    began = time.perf_counter()
    for i in range(10):
        wait_of(guesser.try_login("carol", f"h{i}"))
    refused = time.perf_counter() - began
    # ten refusals (each a GET and a POST) take less than one check of the password
    assert refused < min(checked), (refused, checked)


def test_an_attacker_cannot_keep_the_admin_out_for_long(
    start: Start, clients: Callable[..., Client], clock: Clock
) -> None:
    url = start()
    attacker, admin = clients(url, "127.0.0.2"), clients(url, "127.0.0.3")
    failures = 0
    while failures < 30:  # as fast as the limits let it
        r = attacker.try_login("alice", f"guess-{failures}")
        if r.status_code == 401:
            failures += 1
        else:
            clock.advance(wait_of(r))
    # right after the attacker's latest failure, from a client that was not failing
    wait = wait_of(admin.try_login("alice", "alice-secret"))
    assert wait <= 5
    clock.advance(wait)
    assert admin.try_login("alice", "alice-secret").status_code == 303
    assert wait_of(attacker.try_login("alice", "more")) > wait  # the attacker still waits


def test_failures_are_forgotten_after_15_minutes(
    start: Start, clients: Callable[..., Client], clock: Clock
) -> None:
    guesser = clients(start())
    for i in range(5):
        guesser.try_login("bob", f"g{i}")
    wait_of(guesser.try_login("bob", "bob-secret"))
    clock.advance(15 * 60 + 1)
    assert [guesser.try_login("bob", f"h{i}").status_code for i in range(5)] == [401] * 5


def test_a_made_up_name_is_limited_like_a_real_one(
    start: Start, clients: Callable[..., Client]
) -> None:
    """Else a 429 would tell which names are users."""
    url = start()
    for name in ("alice", "nobody"):
        for i in range(5):
            assert clients(url, f"127.0.1.{i + 1}").try_login(name, "x").status_code == 401
        assert wait_of(clients(url, "127.0.2.1").try_login(name, "x")) == 1


def test_forwarded_for_is_believed_from_a_trusted_proxy_only(
    start: Start, clients: Callable[..., Client]
) -> None:
    def guess(c: Client, forwarded: str, i: int) -> int:
        page = c.request("GET", "/login").text
        token = page.split('name="login_token" value="')[1].split('"')[0]
        form = {"login_token": token, "user": f"nobody-{i}", "password": "x"}
        return c.request("POST", "/login", form, {"x-forwarded-for": forwarded}).status_code

    # Without a trusted proxy the header is anyone's: a new address in it each time buys nothing.
    direct = clients(start())
    answers = [guess(direct, f"10.0.0.{i}", i) for i in range(8)]
    assert answers == [401] * 5 + [429] * 3

    behind = clients(start(proxies=("127.0.0.1",)))
    assert [guess(behind, "203.0.113.7", i) for i in range(6)] == [401] * 5 + [429]
    # what the client wrote in front of the proxy's entry changes nothing
    assert guess(behind, "198.51.100.1, 203.0.113.7", 9) == 429
    assert guess(behind, "garbage, 203.0.113.7", 10) == 429
    # another client behind the same proxy is not held back by the first one
    assert guess(behind, "203.0.113.8", 11) == 401
