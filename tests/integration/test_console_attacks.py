"""Attack by generation on the console's inputs: every filter of every page, every form field,
path segments and methods, with text of any kind, against the real console process.

Whatever is sent, the console answers below 500, with a one-line reason where it refuses
(400, or 413 for a body over the limit, read no further). Without a login nothing changes in
the database either. The reported inputs come first, each on its own; then the generated run,
whose budget is fixed (``NOTIFIER_TEST_CONSOLE_ATTACKS``, 60 sets of inputs a test, each sent to
every route, by default; with
``CI`` set the examples are derandomized, so a CI run is repeatable).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from tests.console_server import Client, Console, console_env, seed

EXAMPLES = int(os.environ.get("NOTIFIER_TEST_CONSOLE_ATTACKS", "60"))
LIMIT = 256 * 1024

#: Every route and its method, path parameters as ``{}``.
ROUTES = [
    ("GET", "/"),
    ("GET", "/login"),
    ("POST", "/login"),
    ("POST", "/logout"),
    ("GET", "/live.json"),
    ("GET", "/notifications"),
    ("POST", "/notifications"),
    ("GET", "/notifications/{}"),
    ("POST", "/notifications/{}/reveal"),
    ("GET", "/notifications/{}/{}"),
    ("POST", "/notifications/{}/{}"),
    ("GET", "/bulk"),
    ("POST", "/bulk/count"),
    ("POST", "/bulk/run"),
    ("GET", "/campaigns"),
    ("GET", "/campaigns/{}/{}"),
    ("POST", "/campaigns/{}/{}"),
    ("POST", "/campaigns/{}/failures.csv"),
    ("GET", "/suppressions"),
    ("POST", "/suppressions/search"),
    ("POST", "/suppressions/{}"),
    ("GET", "/templates"),
    ("GET", "/templates/{}/{}/{}"),
    ("POST", "/templates/{}/{}/{}"),
    ("GET", "/people"),
    ("GET", "/people/{}"),
    ("POST", "/people/{}/prefer"),
    ("GET", "/static/{}"),
]
#: Every query parameter and form field a page or action reads.
FIELDS = [
    "status",
    "channel",
    "provider",
    "campaign",
    "since",
    "until",
    "recipient",
    "dedupe_key",
    "error",
    "q",
    "before",
    "done",
    "action",
    "ids",
    "channels",
    "status_pending",
    "status_processing",
    "max_id",
    "at",
    "reason",
    "payload",
    "user",
    "password",
    "login_token",
]
SPECIAL = [
    "0001-01-01",
    "0001-01-01T00:00+14:00",
    "9999-12-31T23:59",
    "9999-12-31T23:59-14:00",
    "99999999999d",
    "9" * 40 + "m",
    "0d",
    "2026-02-30",
    "24h",
    "-1",
    "99999999999999999999",
    "9223372036854775807",
    "1e309",
    "NaN",
    "a\x00b",
    "\x00",
    "%",
    "_",
    "\\",
    "..",
    "../..",
    "a/b",
    "%2e%2e",
    "\ud800",
    "requeue",
    "cancel",
    "pause",
    "add",
    "remove",
    "email",
    "pending",
    "spring",
    "welcome",
    "en",
    "1",
    "5",
    "{}",
    "[1]",
    '{"a": "\\u0000"}',
    "x" * 5000,
    "[" * 2000,  # JSON too deep for the parser
    # text that does not compress: too big for a btree index entry
    "".join(chr(0x4E00 + i * 7919 % 20_000) for i in range(1500)),
]


def _wire(value: str) -> str:
    """``value`` percent-encoded as UTF-8; a lone surrogate as the bytes it would be."""
    return quote(value.encode("utf-8", "surrogatepass"), safe="")


hostile = st.one_of(
    st.sampled_from(SPECIAL),
    st.sampled_from(SPECIAL),
    st.text(st.characters(exclude_categories=()), max_size=30),
    st.builds(lambda a, b: a + b, st.sampled_from(SPECIAL), st.text(max_size=5)),
)
requests = st.fixed_dictionaries(
    {
        # every route gets the same inputs, and one route another method
        "odd": st.tuples(
            st.sampled_from(["PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "GET", "POST"]),
            st.sampled_from([path for _, path in ROUTES]),
        ),
        "segments": st.lists(hostile, min_size=3, max_size=3),
        # a URL stays under what an HTTP client sends (64 KiB)
        "query": st.dictionaries(
            st.sampled_from(FIELDS), hostile.filter(lambda v: len(_wire(v)) < 8000), max_size=6
        ),
        "form": st.dictionaries(st.sampled_from(FIELDS), hostile, max_size=8),
        "csrf": st.booleans(),
        # now and then, a body over the limit (to the routes that take a form)
        "huge": st.integers(0, 9).map(lambda n: n == 0),
    }
)


def _send(
    web: Client, method: str, path: str, query: dict[str, str], form: dict[str, str]
) -> httpx.Response:
    url = path + ("?" + "&".join(f"{_wire(k)}={_wire(v)}" for k, v in query.items()))
    body = "&".join(f"{_wire(k)}={_wire(v)}" for k, v in form.items()).encode()
    headers = {"content-type": "application/x-www-form-urlencoded"}
    if web.cookies:
        headers["cookie"] = "; ".join(f"{k}={v}" for k, v in web.cookies.items())
    return web.http.request(method, url, content=body, headers=headers)


def _fingerprint(engine: Engine) -> str:
    """Every row of every table the console can change, as one hash."""
    digest = hashlib.sha256()
    with engine.connect() as conn:
        for table in ("notifications", "notification_attempts", "campaigns", "suppressions"):
            rows = conn.execute(text(f"SELECT * FROM {table} ORDER BY 1")).all()
            digest.update(repr(rows).encode())
    return digest.hexdigest()


@pytest.fixture
def console(database_url: str, tmp_path: Path) -> Iterator[Console]:
    server = Console(console_env(database_url), tmp_path / "console.log").start()
    yield server
    server.stop()


@pytest.fixture
def ids(engine: Engine) -> dict[str, int]:
    found = seed(engine)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO templates (name, channel, locale, subject, body)"
                " VALUES ('welcome', 'email', 'en', 'Hi {{ name }}', 'Hello')"
            )
        )
    return found


def _refused_in_one_line(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, (r.status_code, r.text[-400:])
    reason = re.search(r'<p class="(?:refused|error)"[^>]*>([^<]*)</p>', r.text)
    assert reason is not None, r.text[-400:]
    assert "\n" not in reason[1].strip()
    return reason[1]


# --- the reported inputs ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("since=0001-01-01", "since"),
        ("until=9999-12-31T23:59", "until"),
        ("since=99999999999d", "since"),
        ("since=0001-01-01T00:00%2B14:00", "since"),
        ("channel=a%00b", "channel"),
        ("status=pending%00", "status"),
    ],
)
def test_a_filter_out_of_range_answers_400_naming_it(
    console: Console, ids: dict[str, int], query: str, says: str
) -> None:
    alice = console.client()
    alice.login("alice")
    reason = _refused_in_one_line(alice.request("GET", f"/notifications?{query}"), 400)
    assert says in reason


def test_a_nul_byte_in_a_form_answers_400(console: Console, ids: dict[str, int]) -> None:
    alice = console.client()
    csrf = alice.login("alice")
    for path, form in [
        ("/notifications", {"recipient": "a\x00b"}),
        ("/suppressions/search", {"channel": "email", "recipient": "\x00"}),
        ("/suppressions/add", {"channel": "email", "recipient": "x\x00@example.com"}),
        ("/bulk/count", {"action": "requeue", "error": "\x00"}),
    ]:
        r = alice.request("POST", path, {"csrf": csrf, **form})
        assert "NUL" in _refused_in_one_line(r, 400), path
    r = alice.request("GET", "/templates/a%00/email/en")  # a path segment, too
    assert "NUL" in _refused_in_one_line(r, 400)


def test_a_body_over_the_limit_is_refused_before_it_is_read(
    console: Console, ids: dict[str, int], engine: Engine
) -> None:
    big = {"user": "alice", "password": "x" * (LIMIT + 1)}
    anon = console.client()
    anon.request("GET", "/login")
    assert anon.request("POST", "/login", big).status_code == 413
    alice = console.client()
    csrf = alice.login("alice")
    for path in ("/notifications", "/bulk/count", f"/notifications/{ids['pending']}/cancel"):
        r = alice.request("POST", path, {"csrf": csrf, "reason": "x" * (LIMIT + 1)})
        _refused_in_one_line(r, 413)
    with engine.connect() as conn:
        status = conn.execute(
            text("SELECT status FROM notifications WHERE id = :id"), {"id": ids["pending"]}
        ).scalar_one()
    assert status == "pending"


def test_the_error_filter_matches_percent_and_underscore_literally(
    console: Console, engine: Engine, ids: dict[str, int]
) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO notifications (channel, recipient, status, last_error) VALUES"
                " ('null', 'pct@example.com', 'dead', 'quota at 100% for a_b'),"
                " ('null', 'other@example.com', 'dead', 'quota at 1000 for axb')"
            )
        )
    alice = console.client()
    csrf = alice.login("alice")

    def found(error: str) -> list[str]:
        r = alice.request("POST", "/notifications", {"csrf": csrf, "error": error})
        assert r.status_code == 303
        page = alice.request("GET", r.headers["location"]).text
        return re.findall(r'<td class="recipient">([^<]*) #[0-9a-f]{4}</td>', page)

    assert found("100%") == ["p***@example.com"]
    assert found("a_b") == ["p***@example.com"]
    assert found("%") == ["p***@example.com"]
    assert found("\\") == []


# --- the generated run --------------------------------------------------------------------------


def _attack(web: Client, csrf: str, req: dict[str, Any]) -> Iterator[tuple[str, httpx.Response]]:
    """The generated inputs sent to every route, and to one with another method."""
    segments = [_wire(s) for s in req["segments"]]
    form = dict(req["form"])
    if req["csrf"]:
        form["csrf"] = csrf
    if req["huge"]:
        form["reason"] = "x" * LIMIT
    for method, path in [*ROUTES, req["odd"]]:
        if req["huge"] and method != "POST":
            continue
        url = path.format(*segments[: path.count("{}")])
        yield f"{method} {path}", _send(web, method, url, req["query"], form)


_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture
def alice(console: Console) -> list[tuple[Client, str]]:
    """alice's session and its CSRF token, for every example of a test (renewed after a
    generated request logs it out)."""
    web = console.client()
    return [(web, web.login("alice"))]


@pytest.mark.timeout(300)
@_SETTINGS
@given(req=requests)
def test_logged_in_no_input_answers_500(
    req: dict[str, Any], console: Console, ids: dict[str, int], alice: list[tuple[Client, str]]
) -> None:
    web, csrf = alice[0]
    for route, r in _attack(web, csrf, req):
        assert r.status_code < 500, (route, r.status_code, req, console.output()[-3000:])
    web = console.client()  # POST /logout ended the session (with the token given)
    alice[0] = (web, web.login("alice"))


@pytest.mark.timeout(300)
@_SETTINGS
@given(req=requests)
def test_without_login_no_input_answers_500_or_changes_anything(
    req: dict[str, Any], console: Console, ids: dict[str, int], engine: Engine
) -> None:
    before = _fingerprint(engine)
    for route, r in _attack(console.client(), "forged", req):
        assert r.status_code < 500, (route, r.status_code, req, console.output()[-3000:])
    assert _fingerprint(engine) == before, req
