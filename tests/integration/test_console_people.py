"""A person in the console: their profile (addresses masked), preferences with who changed
each, their latest notifications, and a change made on their behalf, which only an admin may
make and which is recorded as the operator's. A real console process, real PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from notifier import client
from notifier.db import profiles
from tests.console_server import Console, console_env


@pytest.fixture
def console(database_url: str, tmp_path: Path) -> Iterator[Console]:
    server = Console(console_env(database_url), tmp_path / "console.log").start()
    yield server
    server.stop()


def test_an_admin_reads_a_person_and_changes_a_preference_on_their_behalf(
    console: Console, engine: Engine
) -> None:
    with engine.begin() as conn:
        client.upsert_profile(conn, "user-42", email="ann@example.com", time_zone="Asia/Tokyo",
                              quiet_hours="22:00-07:00")  # fmt: skip
        profiles.set_preferences(conn, "user-42", {("digest", "email"): False}, "person")
        client.enqueue(conn, channel="email", profile="user-42", subject="s", body="b",
                       category="digest", key="k1")  # fmt: skip
    alice, bob = console.client(), console.client()
    csrf = alice.login("alice")
    bob_csrf = bob.login("bob")

    page = alice.request("GET", "/people/user-42").text
    assert "ann@example.com" not in page  # masked, as everywhere in the console
    assert "Asia/Tokyo" in page
    assert "22:00-07:00" in page
    assert '<a href="/notifications/1">1</a>' in page
    assert "<td>digest</td><td>email</td><td>no</td><td>person</td>" in page
    found = alice.request("GET", "/people?id=user-42")  # the search form
    assert (found.status_code, found.headers["location"]) == (303, "/people/user-42")
    row_page = alice.request("GET", "/notifications/1").text
    assert '<a href="/people/user-42">user-42</a>' in row_page

    # A viewer may read but not change.
    refused = bob.request(
        "POST", "/people/user-42/prefer",
        {"csrf": bob_csrf, "category": "digest", "channel": "email", "state": "on"},
    )  # fmt: skip
    assert refused.status_code == 403
    done = alice.request(
        "POST", "/people/user-42/prefer",
        {"csrf": csrf, "category": "digest", "channel": "email", "state": "on"},
    )  # fmt: skip
    assert (done.status_code, done.headers["location"]) == (303, "/people/user-42?done=1")
    assert "changed by you on their behalf" in alice.request("GET", done.headers["location"]).text
    with engine.connect() as conn:
        history = conn.execute(
            text("SELECT enabled, source FROM preference_history ORDER BY id")
        ).all()
    assert [tuple(r) for r in history] == [(False, "person"), (True, "operator")]
    for bad in ({"category": "Digest!", "channel": "email", "state": "on"},
                {"category": "digest", "channel": "email", "state": "maybe"}):  # fmt: skip
        answer = alice.request("POST", "/people/user-42/prefer", {"csrf": csrf, **bad})
        assert answer.status_code == 400
    assert alice.request("GET", "/people/nobody").status_code == 404
    assert alice.request("GET", "/people/has%20space").status_code == 404
