"""The console's doors, against the real process: the hosts it answers for, the origins its
forms accept, the limits on password guesses and what a failed login leaves in the log."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.acceptance.conftest import wait_for
from tests.console_server import Console, console_env, seed, status


@pytest.fixture
def console(database_url: str, tmp_path: Path) -> Iterator[Console]:
    server = Console(console_env(database_url), tmp_path / "console.log").start()
    yield server
    server.stop()


def test_another_host_is_refused_before_anything_else(console: Console, engine: Engine) -> None:
    ids = seed(engine)
    alice = console.client()
    csrf = alice.login("alice")
    path = f"/notifications/{ids['pending']}/cancel"
    # What a page of evil.example, rebound to 127.0.0.1, sends: its own Host and Origin.
    evil = {"host": "evil.example", "origin": "http://evil.example"}
    r = alice.request("POST", path, {"csrf": csrf}, headers=evil)
    assert r.status_code == 400
    assert r.text.count("\n") <= 1
    assert "NOTIFIER_CONSOLE_HOSTS" in r.text
    assert status(engine, ids["pending"]) == "pending"
    for host in ("evil.example", f"evil.example:{console.port}", f"127.0.0.1:{console.port + 1}"):
        for where in ("/", "/login", "/notifications/", "/static", "/nowhere"):
            r = alice.request("GET", where, headers={"host": host})
            assert r.status_code == 400, (host, where)
            assert "location" not in r.headers
    # The hosts it does answer for: loopback, on its port.
    for host in (f"127.0.0.1:{console.port}", f"localhost:{console.port}"):
        assert alice.request("GET", "/login", headers={"host": host}).status_code == 200


def test_redirects_never_name_a_host(console: Console) -> None:
    anon = console.client()
    for where in ("/", "/notifications", "/notifications/", "/static", "/campaigns/"):
        r = anon.request("GET", where)
        location = r.headers.get("location")
        if location is not None:
            assert location.startswith("/"), (where, location)
            assert not location.startswith("//"), (where, location)


@pytest.mark.parametrize(
    "origin",
    [
        "null",
        "http://evil.example",
        "https://127.0.0.1:{port}",  # another scheme is another origin
        "http://127.0.0.1:{other}",  # and so is another port
        "http://127.0.0.1",
    ],
)
def test_a_form_from_another_origin_is_refused(
    console: Console, engine: Engine, origin: str
) -> None:
    ids = seed(engine)
    alice = console.client()
    csrf = alice.login("alice")
    path = f"/notifications/{ids['pending']}/cancel"
    sent = origin.format(port=console.port, other=console.port + 1)
    r = alice.request("POST", path, {"csrf": csrf}, headers={"origin": sent})
    assert r.status_code == 403, sent
    assert status(engine, ids["pending"]) == "pending"
    own = {"origin": f"http://127.0.0.1:{console.port}"}
    assert alice.request("POST", path, {"csrf": csrf}, headers=own).status_code == 303
    assert status(engine, ids["pending"]) == "cancelled"


def test_password_guesses_are_limited_per_client(console: Console) -> None:
    guesser = console.client()
    answers = [guesser.try_login("alice", f"guess-{i}").status_code for i in range(12)]
    assert answers[:5] == [401] * 5
    assert set(answers[5:]) == {429}
    refused = guesser.try_login("alice", "alice-secret")
    assert refused.status_code == 429  # the right password too, from this client, for now
    assert 1 <= int(refused.headers["retry-after"]) <= 30
    assert "notifier_console=" not in " ".join(guesser.set_cookie).replace(
        "notifier_console_login", ""
    )


def test_a_failed_login_is_logged_with_the_name_and_the_client(console: Console) -> None:
    c = console.client(local_address="127.0.0.3")
    forged = "mallory\nconsole alice logged in (admin)\x1b[2J"
    assert c.try_login(forged, "nope").status_code == 401
    wait_for(lambda: "login failed" in console.output(), 10, "the failed login's line")
    line = next(ln for ln in console.output().splitlines() if "login failed" in ln)
    assert "mallory\\nconsole alice logged in (admin)\\x1b[2J" in line
    assert "127.0.0.3" in line
    assert "alice logged in" not in console.output().replace(line, "")
