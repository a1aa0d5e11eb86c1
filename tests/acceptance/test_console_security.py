"""The console refuses what it must, over plain HTTP against the real process."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from tests.acceptance.conftest import wait_for
from tests.console_server import Console, console_env, seed, status


@pytest.fixture
def console(database_url: str, tmp_path: Path) -> Iterator[Console]:
    server = Console(console_env(database_url), tmp_path / "console.log").start()
    yield server
    server.stop()


def test_without_login_nothing_is_shown_or_changed(console: Console, engine: Engine) -> None:
    ids = seed(engine)
    anon = console.client()
    for path in ("/", "/notifications", f"/notifications/{ids['dead']}", "/campaigns"):
        r = anon.request("GET", path)
        assert (r.status_code, r.headers["location"]) == (303, "/login"), path
    assert anon.request("GET", "/live.json").status_code == 401
    r = anon.request("POST", f"/notifications/{ids['pending']}/cancel", {"csrf": "x"})
    assert r.status_code == 403
    assert status(engine, ids["pending"]) == "pending"


def test_a_wrong_password_and_a_forged_login_form_are_refused(console: Console) -> None:
    c = console.client()
    page = c.request("GET", "/login").text
    assert "login_token" in page
    token = page.split('name="login_token" value="')[1].split('"')[0]
    r = c.request("POST", "/login", {"login_token": token, "user": "alice", "password": "nope"})
    assert r.status_code == 401
    assert "notifier_console=" not in " ".join(c.set_cookie).replace("notifier_console_login", "")
    other = console.client()  # a form posted from elsewhere carries no login cookie
    r = other.request(
        "POST", "/login", {"login_token": token, "user": "alice", "password": "alice-secret"}
    )
    assert r.status_code == 403


def test_actions_need_the_sessions_csrf_token(console: Console, engine: Engine) -> None:
    ids = seed(engine)
    alice = console.client()
    csrf = alice.login("alice")
    path = f"/notifications/{ids['pending']}/cancel"
    assert alice.request("POST", path, {}).status_code == 403
    assert alice.request("POST", path, {"csrf": "forged"}).status_code == 403
    other = console.client()
    other_csrf = other.login("alice")  # another session's token is no good here either
    assert alice.request("POST", path, {"csrf": other_csrf}).status_code == 403
    assert status(engine, ids["pending"]) == "pending"

    r = alice.request("POST", path, {"csrf": csrf, "reason": "asked by support"})
    assert r.status_code == 303
    assert "Cancelled." in alice.request("GET", r.headers["location"]).text
    assert status(engine, ids["pending"]) == "cancelled"
    with engine.connect() as conn:
        who = conn.execute(
            text(
                "SELECT worker, outcome, error FROM notification_attempts"
                " WHERE notification_id = :id"
            ),
            {"id": ids["pending"]},
        ).one()
    assert tuple(who) == ("console:alice", "cancelled", "asked by support")


def test_a_viewer_sees_but_cannot_act(console: Console, engine: Engine) -> None:
    ids = seed(engine)
    bob = console.client()
    csrf = bob.login("bob")
    page = bob.request("GET", f"/notifications/{ids['dead']}")
    assert page.status_code == 200
    assert "gave up after 5 attempts" in page.text
    assert "Requeue" not in page.text
    for path, data in [
        (f"/notifications/{ids['dead']}/requeue", {}),
        (f"/notifications/{ids['pending']}/cancel", {}),
        ("/campaigns/spring/pause", {}),
        ("/suppressions/add", {"channel": "email", "recipient": "x@example.com"}),
        ("/bulk/run", {"action": "requeue", "max_id": "999999", "at": "2030-01-01T00:00:00+00:00"}),
    ]:
        r = bob.request("POST", path, {"csrf": csrf, **data})
        assert r.status_code == 403, path
        assert "may look but not act" in r.text
    assert status(engine, ids["dead"]) == "dead"
    assert status(engine, ids["pending"]) == "pending"
    with engine.connect() as conn:
        assert conn.execute(text("SELECT status FROM campaigns")).scalar_one() == "running"
        assert conn.execute(text("SELECT count(*) FROM suppressions")).scalar_one() == 0


def test_cookies_headers_and_logs_keep_secrets(console: Console, engine: Engine) -> None:
    seed(engine)
    alice = console.client()
    csrf = alice.login("alice")
    session_cookie = next(c for c in alice.set_cookie if c.startswith("notifier_console="))
    flags = {f.strip().lower() for f in session_cookie.split(";")[1:]}
    assert {"httponly", "secure", "samesite=strict"} <= flags
    r = alice.request(
        "POST", "/notifications", {"csrf": csrf, "recipient": "dead.person@example.com"}
    )
    assert r.status_code == 303
    assert "dead.person" not in r.headers["location"]
    assert "q=" in r.headers["location"]
    page = alice.request("GET", r.headers["location"])
    # the row's recipient masked; the address only where the operator typed it, in the form
    cells = re.findall(r'<td class="recipient">([^<]*) #[0-9a-f]{4}</td>', page.text)
    assert cells == ["d***@example.com"]
    assert page.text.count("dead.person@example.com") == 1
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY"
    # The access line is written once the response has gone out: wait for it, not a moment.
    wait_for(lambda: "GET /notifications 200" in console.output(), 10, "the access log line")
    log = console.output()
    assert "dead.person" not in log
    assert "q=" not in log


def test_the_console_refuses_to_start_without_users(database_url: str) -> None:
    env = console_env(database_url, NOTIFIER_CONSOLE_USERS="")
    done = subprocess.run(
        [sys.executable, "-m", "notifier.cli", "console", "--port", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "NOTIFIER_CONSOLE_USERS" in done.stderr
