"""A property of the console's doors, over real HTTP: no request changes anything in the
database unless it carries an admin's session and that session's CSRF token, for one of the
console's hosts, from its own origin (or none), whatever method, Host, Origin, cookies and
form it carries; a viewer's session never changes anything."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from notifier.console.gate import Gate
from notifier.console.site import create_app
from notifier.specs import parse_users
from tests.console_server import USERS, Client, free_port, seed, serving

TABLES = (
    "notifications",
    "notification_attempts",
    "campaigns",
    "templates",
    "suppressions",
)


#: Each table's rows, hashed in one value.
FINGERPRINT = "SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) FROM {} t"


def fingerprint(engine: Engine) -> dict[str, str]:
    with engine.connect() as conn:
        return {
            table: conn.execute(text(FINGERPRINT.format(table))).scalar_one() for table in TABLES
        }


@dataclass
class World:
    engine: Engine
    port: int
    ids: dict[str, int]
    anon: Client
    sessions: dict[str, tuple[str, str]]  # user -> (session cookie, csrf token)


@pytest.fixture
def world(engine: Engine) -> Iterator[World]:
    ids = seed(engine)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO templates (name, channel, locale, subject, body)"
                " VALUES ('welcome', 'email', 'en', 'Hi', 'Hello {{ name }}')"
            )
        )
        conn.execute(
            text(
                "INSERT INTO suppressions (channel, recipient, reason)"
                " VALUES ('email', 'kept@example.com', 'asked')"
            )
        )
    port = free_port()
    app = create_app(engine, parse_users(USERS), gate=Gate.loopback(port))
    with serving(app, port) as url:
        sessions = {}
        for user in ("alice", "bob"):
            c = Client(url)
            csrf = c.login(user)
            sessions[user] = (c.cookies["notifier_console"], csrf)
            c.http.close()
        anon = Client(url)
        yield World(engine, port, ids, anon, sessions)
        anon.http.close()


PATHS = [
    "/notifications/{pending}/cancel",
    "/notifications/{processing}/cancel",
    "/notifications/{dead}/requeue",
    "/notifications/{hostile}/requeue",
    "/notifications/{dead}/reveal",
    "/campaigns/spring/pause",
    "/campaigns/spring/cancel",
    "/campaigns/spring%2F..%2F..%2Fnotifications%2F{pending}/cancel",
    "/suppressions/add",
    "/suppressions/remove",
    "/suppressions/search",
    "/bulk/count",
    "/bulk/run",
    "/templates/welcome/email/en",
    "/notifications",
    "/login",
    "/",
]
FIELDS = ["action", "ids", "channel", "recipient", "reason", "max_id", "at", "status_pending"]
VALUES = st.one_of(
    st.sampled_from(
        ["requeue", "cancel", "email", "kept@example.com", "x@example.com", "1", "999999"]
    ),
    st.sampled_from(["2030-01-01T00:00:00+00:00", "on", ""]),
    st.text(max_size=20),
)


@st.composite
def requests(draw: st.DrawFn) -> dict[str, object]:
    return {
        "method": draw(st.sampled_from(["POST", "POST", "POST", "GET", "PUT", "DELETE"])),
        "path": draw(st.sampled_from(PATHS)),
        "host": draw(st.sampled_from(["own", "own", "evil", "other port", "localhost"])),
        "origin": draw(st.sampled_from([None, "own", "null", "evil", "https", "other port"])),
        "cookie": draw(st.sampled_from([None, "garbage", "bob", "alice", "alice", "alice"])),
        "csrf": draw(st.sampled_from([None, "garbage", "bob", "alice", "alice"])),
        "form": draw(st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=5)),
    }


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(req=requests())
def test_nothing_changes_without_an_admins_session_and_token_from_its_own_origin(
    world: World, req: dict[str, object]
) -> None:
    port = world.port
    hosts = {
        "own": f"127.0.0.1:{port}",
        "localhost": f"localhost:{port}",
        "evil": "evil.example",
        "other port": f"127.0.0.1:{port + 1}",
    }
    origins = {
        "own": f"http://127.0.0.1:{port}",
        "null": "null",
        "evil": "http://evil.example",
        "https": f"https://127.0.0.1:{port}",
        "other port": f"http://127.0.0.1:{port + 1}",
    }
    headers = {"host": hosts[str(req["host"])]}
    if req["origin"] is not None:
        headers["origin"] = origins[str(req["origin"])]
    cookie, csrf = req["cookie"], req["csrf"]
    if cookie == "garbage":
        headers["cookie"] = "notifier_console=garbage"
    elif cookie is not None:
        headers["cookie"] = f"notifier_console={world.sessions[str(cookie)][0]}"
    form = dict(req["form"])  # type: ignore[call-overload]
    if csrf == "garbage":
        form["csrf"] = "garbage"
    elif csrf is not None:
        form["csrf"] = world.sessions[str(csrf)][1]
    path = str(req["path"]).format(**world.ids)
    may_change = (
        req["method"] == "POST"
        and cookie == "alice"
        and csrf == "alice"
        and req["host"] in ("own", "localhost")
        and req["origin"] in (None, "own")
    )
    before = fingerprint(world.engine)
    r = world.anon.http.request(str(req["method"]), path, data=form, headers=headers)
    if not may_change:
        assert fingerprint(world.engine) == before, (r.status_code, path, req)
    if req["host"] in ("evil", "other port"):
        assert r.status_code == 400
        assert "location" not in r.headers
