"""Send-time guards, expiry, cancel races and priority, against real servers and PostgreSQL.

The ``http`` guard is asked by a real HTTP server on loopback (pytest-httpserver), or by
``SilentServer``, a bare socket that reads the request and never answers. The dispatcher tests
run the real ``Dispatcher`` with the entry-point registries of providers and guards; a row that
must not be sent is a webhook to a loopback receiver, which proves it by its empty log.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import psycopg
import pytest
from pytest_httpserver import HTTPServer
from sqlalchemy import Engine, text
from werkzeug import Request, Response

import notifier
from notifier.delivery import guards
from notifier.delivery.batch import BatchReport
from notifier.delivery.dispatcher import RECHECK_AFTER, Dispatcher
from notifier.delivery.guards import GuardError, HttpGuard, Send, Skip, Verdict
from notifier.models import Notification
from notifier.providers import load_registry
from notifier.settings import Settings, get_settings
from tests.db_faults import lock_waiters, wait_until
from tests.factories import MakeRow, MakeRows, SetEnv, ago, from_now

# Both loopbacks: "localhost" resolves to ::1 as well as 127.0.0.1 on many machines.
LOOPBACK = "127.0.0.0/8,::1/128"
KEY = "confirm-reminder:user:42"
#: The guarded row of the dispatcher tests: a reminder to confirm, unless the user already did.
CONFIRM = {
    "channel": "webhook",
    "subject": "Confirm your email",
    "payload": {"user": 42},
    "dedupe_key": KEY,
}


class SilentServer:
    """Accepts connections and reads each request, but never answers: a guard that hangs."""

    def __init__(self) -> None:
        self.requests: list[bytes] = []
        self.received = threading.Event()
        self._stopping = threading.Event()
        self._open: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/guard"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            self._open.append(conn)  # held open, unanswered, until stop()
            conn.settimeout(5)
            data = b""
            with contextlib.suppress(OSError):
                while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < int(
                    _header(data, b"content-length") or 0
                ):
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
            self.requests.append(data)
            self.received.set()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(5)
        for conn in self._open:
            conn.close()
        self._listener.close()


def _header(request: bytes, name: bytes) -> bytes | None:
    head = request.split(b"\r\n\r\n", 1)[0]
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    return None


@pytest.fixture
def silent_server() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.stop()


def _notification(**fields: Any) -> Notification:
    values: dict[str, Any] = {
        "id": 7,
        "channel": "email",
        "recipient": "ann@example.com",
        "subject": "Confirm your email",
        "body": "Click the link.",
        "payload": {"user": 42},
        "attempts": 1,
        "max_attempts": 5,
        "claim_token": uuid4(),
        "created_at": datetime.now(UTC),
        "dedupe_key": KEY,
        "guard": "http",
    }
    values.update(fields)
    return Notification(**values)


# -- the guard alone: what its server answers -> its verdict --------------------------------------

ANSWERS: list[tuple[str, Callable[[], Response], Verdict | str]] = [
    # name, the guard server's answer, the verdict or the GuardError's message (a fragment)
    ("yes", lambda: Response('{"send": true}', content_type="application/json"), Send()),
    (
        "no with a reason",
        lambda: Response(
            json.dumps({"send": False, "reason": "user 42 confirmed"}),
            content_type="application/json",
        ),
        Skip("guard http: user 42 confirmed"),
    ),
    ("no without a reason", lambda: Response('{"send": false}'), Skip("guard http: no")),
    (
        "no with an empty reason",
        lambda: Response('{"send": false, "reason": ""}'),
        Skip("guard http: no"),
    ),
    ("500", lambda: Response("database down", status=500), "answered HTTP 500: database down"),
    ("503", lambda: Response("", status=503), "answered HTTP 503"),
    ("404", lambda: Response("no such route", status=404), "answered HTTP 404: no such route"),
    (
        "a redirect, not followed",
        lambda: Response("", status=302, headers={"Location": "http://example.com/"}),
        "answered HTTP 302",
    ),
    (
        "204 without a body",
        lambda: Response("", status=204),
        "answered HTTP 204",
    ),
    ("200, not JSON", lambda: Response("yes please"), "not JSON: yes please"),
    ("200, empty body", lambda: Response(""), "not JSON"),
    ("200, send is a string", lambda: Response('{"send": "yes"}'), 'must answer {"send": true}'),
    ("200, send is a number", lambda: Response('{"send": 1}'), 'must answer {"send": true}'),
    ("200, no send field", lambda: Response('{"ok": true}'), 'must answer {"send": true}'),
    ("200, a JSON list", lambda: Response("[true]"), 'must answer {"send": true}'),
    ("200, JSON true", lambda: Response("true"), 'must answer {"send": true}'),
]


@pytest.mark.parametrize(
    ("answer", "expected"), [a[1:] for a in ANSWERS], ids=[a[0] for a in ANSWERS]
)
def test_http_guard_sends_only_on_an_explicit_yes(
    httpserver: HTTPServer, answer: Callable[[], Response], expected: Verdict | str
) -> None:
    httpserver.expect_request("/guard", method="POST").respond_with_handler(lambda _: answer())
    guard = HttpGuard(Settings(guard_http_url=httpserver.url_for("/guard"), guard_http_timeout=5))
    n = _notification(payload={"user": 42, "lang": "fr"})
    if isinstance(expected, str):
        with pytest.raises(GuardError) as raised:
            guard.check(n)
        assert expected in str(raised.value)
    else:
        assert guard.check(n) == expected

    assert len(httpserver.log) == 1
    request = httpserver.log[0][0]
    assert request.headers["Content-Type"] == "application/json"
    assert request.get_json() == {
        "id": 7,
        "channel": "email",
        "recipient": "ann@example.com",
        "dedupe_key": KEY,
        "payload": {"user": 42, "lang": "fr"},
    }


def test_http_guard_that_hangs_is_an_error_after_its_timeout(
    silent_server: SilentServer, set_env: SetEnv
) -> None:
    """Configured from the environment, as a worker is: NOTIFIER_GUARD_HTTP_TIMEOUT=1."""
    set_env(guard_http_url=silent_server.url, guard_http_timeout=1)
    guard = guards.load_registry(get_settings())["http"]

    started = time.monotonic()
    with pytest.raises(GuardError, match=r"no answer within 1\.0s"):
        guard.check(_notification(dedupe_key=None))
    took = time.monotonic() - started

    assert silent_server.received.is_set()  # the server had the whole request, and kept silent
    request = silent_server.requests[0]
    assert request.startswith(b"POST /guard HTTP/1.1\r\n")
    assert json.loads(request.split(b"\r\n\r\n", 1)[1])["dedupe_key"] is None
    assert 0.9 <= took < 3.0


def test_http_guard_whose_server_is_down_is_an_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]  # closed on leaving: nothing listens there any more
    guard = HttpGuard(Settings(guard_http_url=f"http://127.0.0.1:{port}/guard"))
    with pytest.raises(GuardError, match="http guard unreachable: ConnectError"):
        guard.check(_notification())


def test_http_guard_without_a_url_says_which_setting_is_missing(set_env: SetEnv) -> None:
    set_env(guard_http_url=None)
    guard = guards.load_registry(get_settings())["http"]
    with pytest.raises(GuardError, match="NOTIFIER_GUARD_HTTP_URL"):
        guard.check(_notification())


# -- through the dispatcher -----------------------------------------------------------------------


@pytest.fixture
def loopback_webhooks(set_env: SetEnv) -> None:
    """Let the webhook provider reach the loopback receiver; settings re-read after the test."""
    set_env(webhook_allow_http=True, webhook_allowed_networks=LOOPBACK)


def _dispatcher(
    engine: Engine,
    settings: Settings,
    set_env: SetEnv,
    guard_url: str | None,
    **kwargs: Any,
) -> Dispatcher:
    """The real dispatcher with every registered provider and guard, as a worker builds it."""
    set_env(guard_http_url=guard_url, guard_http_timeout=1)
    return Dispatcher(
        engine,
        load_registry(get_settings()),
        settings,
        guards=guards.load_registry(get_settings()),
        **kwargs,
    )


def _row(engine: Engine, row_id: int) -> tuple[Any, ...]:
    with engine.connect() as conn:
        return tuple(
            conn.execute(
                text("SELECT status, attempts, last_error FROM notifications WHERE id = :id"),
                {"id": row_id},
            ).one()
        )


def _hooks(httpserver: HTTPServer) -> list[Request]:
    return [r for r, _ in httpserver.log if r.path == "/hook"]


def _guard_asks(httpserver: HTTPServer) -> list[Any]:
    return [r.get_json() for r, _ in httpserver.log if r.path == "/guard"]


OUTCOMES = [
    # the guard server's answer -> the row's status, attempts, last_error; webhooks sent
    ("yes", "sent", 1, None, 1),
    ("no", "cancelled", 1, "guard http: user 42 confirmed", 0),
    ("error", "pending", 1, "guard http: http guard answered HTTP 500: database down", 0),
    ("hang", "pending", 1, "guard http: http guard gave no answer within 1.0s", 0),
    (
        "not set",
        "pending",
        1,
        "guard http: the http guard needs NOTIFIER_GUARD_HTTP_URL; it is not set",
        0,
    ),
]


@pytest.mark.usefixtures("loopback_webhooks")
@pytest.mark.parametrize(
    ("answer", "status", "attempts", "error", "hooks"), OUTCOMES, ids=[o[0] for o in OUTCOMES]
)
def test_guard_decides_what_the_dispatcher_does(
    engine: Engine,
    make_row: MakeRow,
    settings: Settings,
    httpserver: HTTPServer,
    silent_server: SilentServer,
    set_env: SetEnv,
    answer: str,
    status: str,
    attempts: int,
    error: str | None,
    hooks: int,
) -> None:
    httpserver.expect_request("/hook", method="POST").respond_with_data("ok")
    responses = {
        "yes": Response('{"send": true}'),
        "no": Response('{"send": false, "reason": "user 42 confirmed"}'),
        "error": Response("database down", status=500),
    }
    if answer in responses:
        httpserver.expect_request("/guard", method="POST").respond_with_response(responses[answer])
    guard_url = {"hang": silent_server.url, "not set": None}.get(
        answer, httpserver.url_for("/guard")
    )
    row_id = make_row(**CONFIRM, recipient=httpserver.url_for("/hook"), guard="http")

    dispatcher = _dispatcher(engine, settings, set_env, guard_url)
    started = time.monotonic()
    report = dispatcher.run_once()
    took = time.monotonic() - started
    dispatcher.close()

    assert _row(engine, row_id) == (status, attempts, error)
    assert len(_hooks(httpserver)) == hooks
    assert report.claimed == 1
    assert report.stale == 0  # every outcome was recorded
    if answer in responses:  # the guard was asked exactly once, about this row
        assert _guard_asks(httpserver) == [
            {
                "id": row_id,
                "channel": "webhook",
                "recipient": httpserver.url_for("/hook"),
                "dedupe_key": KEY,
                "payload": {"user": 42},
            }
        ]
    if answer == "hang":
        assert silent_server.received.is_set()
        assert took < 3.0


@pytest.mark.usefixtures("loopback_webhooks")
def test_unknown_guard_is_dead_with_a_clear_message(
    engine: Engine, make_row: MakeRow, settings: Settings, httpserver: HTTPServer, set_env: SetEnv
) -> None:
    httpserver.expect_request("/hook", method="POST").respond_with_data("ok")
    httpserver.expect_request("/guard", method="POST").respond_with_json({"send": True})
    row_id = make_row(**CONFIRM, recipient=httpserver.url_for("/hook"), guard="crm")

    dispatcher = _dispatcher(engine, settings, set_env, httpserver.url_for("/guard"))
    dispatcher.run_once()
    dispatcher.close()

    assert _row(engine, row_id) == ("dead", 1, "unknown guard 'crm'; this deployment has: http")
    assert httpserver.log == []  # neither a guard was asked nor the webhook sent


@pytest.mark.usefixtures("loopback_webhooks")
def test_expired_rows_are_cancelled_without_calling_provider_or_guard(
    engine: Engine, make_row: MakeRow, settings: Settings, httpserver: HTTPServer, set_env: SetEnv
) -> None:
    httpserver.expect_request("/hook", method="POST").respond_with_data("ok")
    httpserver.expect_request("/guard", method="POST").respond_with_json({"send": True})
    hook = httpserver.url_for("/hook")
    ended, on = "flash sale, ended", "flash sale, on"
    expired = make_row(channel="webhook", recipient=hook, subject=ended, expires_at=ago(seconds=1))
    expired_guarded = make_row(
        channel="webhook", recipient=hook, subject=ended, guard="http", expires_at=ago(seconds=1)
    )
    fresh = make_row(channel="webhook", recipient=hook, subject=on, expires_at=from_now(hours=1))

    dispatcher = _dispatcher(engine, settings, set_env, httpserver.url_for("/guard"))
    report = dispatcher.run_once()
    dispatcher.close()

    assert _row(engine, expired) == ("cancelled", 1, "expired")
    assert _row(engine, expired_guarded) == ("cancelled", 1, "expired")
    assert _row(engine, fresh) == ("sent", 1, None)
    assert [r.get_json()["id"] for r in _hooks(httpserver)] == [fresh]  # only the fresh one
    assert _guard_asks(httpserver) == []
    assert (report.claimed, report.sent, report.cancelled, report.stale) == (3, 1, 2, 0)


@pytest.mark.usefixtures("loopback_webhooks")
def test_row_cancelled_while_its_guard_is_asked_is_not_sent(
    engine: Engine, make_row: MakeRow, settings: Settings, httpserver: HTTPServer, set_env: SetEnv
) -> None:
    """The producer cancels while the guard decides, and the guard says yes: no send."""
    seen: list[tuple[str, bool]] = []

    def guard_cancels_then_says_yes(request: Request) -> Response:
        with engine.begin() as conn:  # the producer, on a connection of its own
            status = conn.execute(
                text("SELECT status FROM notifications WHERE dedupe_key = :key"), {"key": KEY}
            ).scalar_one()
            seen.append((status, notifier.cancel(conn, KEY, "user confirmed")))
        return Response('{"send": true}')

    httpserver.expect_request("/hook", method="POST").respond_with_data("ok")
    httpserver.expect_request("/guard", method="POST").respond_with_handler(
        guard_cancels_then_says_yes
    )
    row_id = make_row(**CONFIRM, recipient=httpserver.url_for("/hook"), guard="http")

    dispatcher = _dispatcher(engine, settings, set_env, httpserver.url_for("/guard"))
    report = dispatcher.run_once()
    dispatcher.close()

    assert seen == [("processing", True)]  # the row was claimed, and the cancel took it
    assert _row(engine, row_id) == ("cancelled", 1, "user confirmed")
    assert _hooks(httpserver) == []
    assert (report.claimed, report.sent) == (1, 0)


@pytest.mark.usefixtures("loopback_webhooks")
def test_rows_cancelled_between_claim_and_send_are_not_sent(
    engine: Engine,
    make_rows: MakeRows,
    database_url: str,
    settings: Settings,
    httpserver: HTTPServer,
    set_env: SetEnv,
) -> None:
    """Batch-level: the producer's cancel commits right after the claim, before any send.

    PostgreSQL's lock queue places it there exactly. A SHARE lock on the table holds the claim
    back; the producer then asks for an ACCESS EXCLUSIVE lock, which queues behind the claim
    and ahead of every later statement of the dispatcher. Once the SHARE lock goes, the claim
    commits, the producer cancels one claimed row and commits, and only then can the dispatcher
    look at the table again.
    """
    httpserver.expect_request("/hook", method="POST").respond_with_data("ok")
    ids = make_rows(
        5, channel="webhook", recipient=httpserver.url_for("/hook"), dedupe_key=lambda i: f"k{i}"
    )
    dispatcher = _dispatcher(engine, settings, set_env, None)
    dsn = database_url.replace("postgresql+psycopg://", "postgresql://")
    reports: list[BatchReport] = []
    seen: list[tuple[str, bool]] = []

    def producer() -> None:
        with psycopg.connect(dsn) as conn:
            conn.execute("LOCK TABLE notifications IN ACCESS EXCLUSIVE MODE")
            status = conn.execute(
                "SELECT status FROM notifications WHERE dedupe_key = 'k3'"
            ).fetchone()
            assert status is not None
            seen.append((status[0], notifier.cancel(conn, "k3", "user confirmed")))

    with psycopg.connect(dsn, autocommit=True) as monitor, psycopg.connect(dsn) as blocker:
        blocker.execute("LOCK TABLE notifications IN SHARE MODE")
        dispatching = threading.Thread(target=lambda: reports.append(dispatcher.run_once()))
        dispatching.start()
        wait_until(lambda: lock_waiters(monitor) == 1, "the claim to wait for the table", 10.0)
        cancelling = threading.Thread(target=producer)
        cancelling.start()
        wait_until(
            lambda: lock_waiters(monitor) == 2, "the producer to queue behind the claim", 10.0
        )
        blocker.commit()
        dispatching.join(10)
        cancelling.join(10)
    dispatcher.close()

    assert seen == [("processing", True)]  # claimed, and not yet sent, when it was cancelled
    assert _row(engine, ids[2]) == ("cancelled", 1, "user confirmed")
    sent = sorted(r.get_json()["id"] for r in _hooks(httpserver))
    assert sent == [ids[0], ids[1], ids[3], ids[4]]
    assert (reports[0].claimed, reports[0].sent, reports[0].stale) == (5, 4, 1)


@pytest.mark.usefixtures("loopback_webhooks")
def test_row_cancelled_while_its_batch_is_sending_is_not_sent(
    engine: Engine, make_rows: MakeRows, settings: Settings, httpserver: HTTPServer, set_env: SetEnv
) -> None:
    """One send at a time: while row 1 is at the receiver, the producer cancels row 2.

    Row 2's send starts more than ``RECHECK_AFTER`` after the batch was last looked at, so it is
    looked at again first.
    """
    cancelled: list[bool] = []

    def slow_first_hook(request: Request) -> Response:
        if request.get_json()["id"] == ids[0]:
            with engine.begin() as conn:
                cancelled.append(notifier.cancel(conn, "second", "user confirmed"))
            time.sleep(RECHECK_AFTER * 2)  # row 1 is slow to answer
        return Response("ok")

    httpserver.expect_request("/hook", method="POST").respond_with_handler(slow_first_hook)
    ids = make_rows(
        2,
        channel="webhook",
        recipient=httpserver.url_for("/hook"),
        dedupe_key=lambda i: ["first", "second"][i - 1],
    )
    one_at_a_time = {"send_concurrency": 1, "async_send_concurrency": 1}
    dispatcher = _dispatcher(engine, settings.model_copy(update=one_at_a_time), set_env, None)
    dispatcher.run_once()
    dispatcher.close()

    assert cancelled == [True]  # row 2 was claimed and unsent when the producer cancelled it
    assert _row(engine, ids[1]) == ("cancelled", 1, "user confirmed")
    assert [r.get_json()["id"] for r in _hooks(httpserver)] == [ids[0]]


def test_urgent_row_jumps_a_backlog(
    engine: Engine, settings: Settings, make_row: MakeRow, make_rows: MakeRows
) -> None:
    """500 rows waiting for an hour, then one with priority 10: it is in the first batch."""
    make_rows(500, recipient="bulk", next_attempt_at=ago(hours=1))
    urgent = make_row(recipient="urgent", priority=10)
    dispatcher = Dispatcher(engine, load_registry(get_settings()), settings)
    report = dispatcher.run_once()
    dispatcher.close()

    assert settings.batch_size == 50
    assert report.claimed == report.sent == 50
    assert _row(engine, urgent) == ("sent", 1, None)
    with engine.connect() as conn:
        sent_bulk = conn.execute(
            text("SELECT count(*) FROM notifications WHERE status = 'sent' AND priority = 0")
        ).scalar_one()
    assert sent_bulk == 49
