"""One row never hurts another: rows a producer, a receiver or the database make poisonous.

Each test mixes poisonous rows with good ones, runs the real dispatcher against the real
database (and real receivers on loopback), and checks that the claim and the batch survive,
that every good row is sent exactly once, and that each poisonous row ends alone, with a reason.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import pytest
import redis
from sqlalchemy import Engine, text

from notifier.delivery.dispatcher import Dispatcher
from notifier.delivery.ratelimit import RateLimiter
from notifier.models import Notification
from notifier.providers import Outcome, Provider, Sent, load_registry, registry_of
from notifier.providers.null import NullProvider
from notifier.settings import Settings, get_settings
from tests.factories import MakeRow, MakeRows, SetEnv
from tests.receiver import Receiver


def outcomes(engine: Engine) -> dict[str, tuple[str, int, str | None]]:
    """By dedupe key: (status, attempts, last_error)."""
    with engine.begin() as conn:
        return {
            key: (status, attempts, error)
            for key, status, attempts, error in conn.execute(
                text(
                    "SELECT dedupe_key, status, attempts, last_error FROM notifications"
                    " WHERE dedupe_key IS NOT NULL"
                )
            ).all()
        }


def good_rows(engine: Engine) -> list[tuple[str, int, int]]:
    with engine.begin() as conn:
        return [
            (s, a, n)
            for s, a, n in conn.execute(
                text(
                    "SELECT status, attempts, count(*) FROM notifications"
                    " WHERE dedupe_key IS NULL GROUP BY 1, 2"
                )
            ).all()
        ]


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.fixture
def receiver(set_env: SetEnv) -> Iterator[Receiver]:
    """A webhook receiver on loopback, which the providers are allowed to call."""
    set_env(webhook_allow_http=True, webhook_allowed_networks="127.0.0.0/8")
    r = Receiver().start()
    yield r
    r.stop()


def webhook_settings(database_url: str, **overrides: Any) -> Settings:
    return Settings(
        database_url=database_url,
        webhook_allow_http=True,
        webhook_allowed_networks="127.0.0.0/8",
        batch_size=100,
        **overrides,
    )


def test_rows_the_claim_cannot_decode_die_alone(
    engine: Engine, database_url: str, make_rows: MakeRows, raw_row: MakeRow
) -> None:
    """Infinite timestamps, JSON too deep for Python, bodies and payloads over the limits:
    each used to fail the claim itself (every worker stopped on the same row) or the batch."""
    huge = json.dumps({"blob": secrets.token_hex(1_000_000)})  # incompressible, ~2 MB stored
    poison = {
        "never expires": ({"expires_at": "infinity"}, ("sent", 1, None)),
        "expired long ago": (
            {"expires_at": "-infinity"},
            ("cancelled", 1, "expired"),
        ),
        "created at infinity": ({"created_at": "infinity"}, ("sent", 1, None)),
        "created far in the future": ({"created_at": "294276-01-01"}, ("sent", 1, None)),
        "too deep for Python": (
            {"payload": json.dumps({"a": json.loads(nested(500))}).replace("[]", nested(3000))},
            (
                "dead",
                1,
                "invalid notification: payload is nested too deeply to be read; "
                "keep it to a few levels",
            ),
        ),
        "deeper than the limit": (
            {"payload": json.dumps({"a": json.loads(nested(100))})},
            (
                "dead",
                1,
                "invalid notification: payload is nested 65 levels deep; at most 64 allowed",
            ),
        ),
        "body over the limit": (
            {"body": "x" * 2_000_000},
            (
                "dead",
                1,
                "invalid notification: body is 2000000 bytes; at most 1048576 allowed "
                "(NOTIFIER_MAX_BODY_BYTES): send a link to the content instead",
            ),
        ),
        "payload far over the limit": ({"payload": huge}, ("dead", 1, "*stored in")),
        "subject too long": (
            {"subject": "s" * 5000},
            ("dead", 1, "invalid notification: subject is longer than 2048 characters"),
        ),
        "guard name too long": (
            {"guard": "g" * 5000},
            ("dead", 1, "invalid notification: guard is longer than 200 characters"),
        ),
        "webhook URL urlsplit rejects": (
            {"channel": "webhook", "recipient": "https://[::1/"},
            ("dead", 1, "*invalid notification: "),
        ),
    }
    make_rows(40, recipient=lambda i: f"good-{i - 1}")
    for name, (columns, _) in poison.items():
        raw_row(**columns, dedupe_key=name)

    dispatcher = Dispatcher(engine, load_registry(get_settings()), webhook_settings(database_url))
    try:
        reports = dispatcher.drain(budget_seconds=60)
    finally:
        dispatcher.close()

    assert sum(r.claimed for r in reports) == 40 + len(poison)
    assert good_rows(engine) == [("sent", 1, 40)]
    ended = outcomes(engine)
    for name, (_, (status, attempts, error)) in poison.items():
        got = ended[name]
        assert got[:2] == (status, attempts), (name, got)
        if error is not None and error.startswith("*"):
            assert error[1:] in (got[2] or ""), (name, got)
        else:
            assert got[2] == error, (name, got)


def test_a_receiver_answering_nul_and_escapes_cannot_make_good_rows_resend(
    engine: Engine, database_url: str, receiver: Receiver, make_row: MakeRow, make_rows: MakeRows
) -> None:
    """A NUL in an error text once made the batch's outcome write fail, and every row of the
    batch already sent went out again after each lease."""
    receiver.answers["/nul"] = (500, {}, b"broken\x00\x01\x1b[2J\xff body")
    make_rows(10, channel="webhook", recipient=f"{receiver.base()}/ok")
    make_row(channel="webhook", recipient=f"{receiver.base()}/nul", dedupe_key="nul")

    dispatcher = Dispatcher(engine, load_registry(get_settings()), webhook_settings(database_url))
    try:
        report = dispatcher.run_once()
    finally:
        dispatcher.close()

    assert (report.sent, report.retried, report.stale) == (10, 1, 0)
    assert receiver.paths() == {"/ok": 10, "/nul": 1}
    assert good_rows(engine) == [("sent", 1, 10)]
    status, attempts, error = outcomes(engine)["nul"]
    assert (status, attempts) == ("pending", 1)
    assert (error or "").startswith("HTTP 500 from 127.0.0.1:")
    assert (error or "").isprintable()  # no NUL, no escape sequence


def test_an_outcome_the_database_refuses_is_recorded_alone(
    engine: Engine, database_url: str, receiver: Receiver, make_row: MakeRow, make_rows: MakeRows
) -> None:
    """A write refused for its data (here by a CHECK the test adds) is split down to the row
    that causes it: the sent rows beside it are recorded as sent, and that row plainly."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "ALTER TABLE notifications ADD CONSTRAINT refuses_poison"
                " CHECK (last_error IS NULL OR last_error NOT LIKE '%poison%')"
            )
        )
    receiver.answers["/poison"] = (503, {}, b"poison")
    make_rows(12, channel="webhook", recipient=f"{receiver.base()}/ok")
    make_row(channel="webhook", recipient=f"{receiver.base()}/poison", dedupe_key="p")

    dispatcher = Dispatcher(engine, load_registry(get_settings()), webhook_settings(database_url))
    try:
        report = dispatcher.run_once()
    finally:
        dispatcher.close()

    assert report.stale == 0
    assert good_rows(engine) == [("sent", 1, 12)]
    status, attempts, error = outcomes(engine)["p"]
    assert (status, attempts) == ("pending", 1)
    assert error == (
        "its outcome could not be stored (CheckViolation, SQLSTATE 23514); see the worker's log"
    )
    assert receiver.paths() == {"/ok": 12, "/poison": 1}


def test_a_receivers_429_holds_back_that_receiver_alone(
    engine: Engine, database_url: str, receiver: Receiver, redis_url: str, make_rows: MakeRows
) -> None:
    """A 429 once held back every webhook; now only the receiver (host and port) that sent it."""
    other = Receiver().start()
    try:
        receiver.answers["/busy"] = (429, {"Retry-After": "120"}, b"slow down")
        busy, ok = f"{receiver.base()}/busy", f"{other.base()}/ok"
        limiter = RateLimiter(redis.Redis.from_url(redis_url), {})
        settings = webhook_settings(database_url, rate_limits="")

        def run(prefix: str) -> None:
            make_rows(3, channel="webhook", recipient=busy, dedupe_key=lambda i: f"{prefix}{i - 1}")
            make_rows(5, channel="webhook", recipient=ok)
            dispatcher = Dispatcher(
                engine, load_registry(get_settings()), settings, limiter=limiter
            )
            try:
                dispatcher.run_once()
            finally:
                dispatcher.close()

        run("busy")
        assert (receiver.paths(), other.paths()) == ({"/busy": 3}, {"/ok": 5})
        # Rows for the busy receiver are now handed back without calling it; the others go.
        run("later")
        assert (receiver.paths(), other.paths()) == ({"/busy": 3}, {"/ok": 10})
    finally:
        other.stop()
    assert good_rows(engine) == [("sent", 1, 10)]
    with engine.begin() as conn:
        rows = conn.execute(
            text(
                "SELECT dedupe_key, status, attempts, deferrals, next_attempt_at > now() + "
                "interval '100 seconds' FROM notifications WHERE dedupe_key IS NOT NULL"
            )
        ).all()
    assert {tuple(r[1:]) for r in rows if r[0].startswith("busy")} == {("pending", 0, 1, True)}
    assert {tuple(r[1:]) for r in rows if r[0].startswith("later")} == {("pending", 0, 0, True)}


def test_deferrals_end_past_their_limit_or_the_rows_expiry(
    engine: Engine, database_url: str, receiver: Receiver, make_row: MakeRow
) -> None:
    receiver.answers["/busy"] = (429, {"Retry-After": "60"}, b"")
    busy = f"{receiver.base()}/busy"
    make_row(channel="webhook", recipient=busy, dedupe_key="worn out", deferrals=20)
    make_row(channel="webhook", recipient=busy, dedupe_key="still patient", deferrals=19)
    make_row(
        channel="webhook",
        recipient=busy,
        dedupe_key="expiring",
        expires_at=datetime.now(UTC) + timedelta(seconds=30),
    )

    dispatcher = Dispatcher(engine, load_registry(get_settings()), webhook_settings(database_url))
    try:
        dispatcher.run_once()
    finally:
        dispatcher.close()

    ended = outcomes(engine)
    answer = f"HTTP 429 from 127.0.0.1:{busy.split(':')[2].split('/')[0]}:"
    assert ended["worn out"] == (
        "dead",
        1,
        "gave up after being asked to slow down 21 times (NOTIFIER_MAX_DEFERRALS=20); "
        f"last answer: {answer}",
    )
    assert ended["still patient"][:2] == ("pending", 0)
    assert ended["expiring"] == (
        "cancelled",
        1,
        f"expired while its receiver asked to wait: {answer}",
    )


class Brittle(Provider):
    """A provider with a bug: it raises on one recipient instead of answering."""

    channel: ClassVar[str] = "null"

    def validate(self, notification: Notification) -> None:
        return

    def send(self, notification: Notification) -> Outcome:
        if notification.recipient == "boom":
            raise KeyError("unexpected")
        return Sent("ok")

    def close(self) -> None:
        return


def test_a_provider_that_raises_ends_that_row_not_the_batch(
    engine: Engine, database_url: str, make_row: MakeRow, make_rows: MakeRows
) -> None:
    make_rows(9, recipient=lambda i: f"good-{i - 1}")
    make_row(recipient="boom", dedupe_key="boom")
    settings = Settings(database_url=database_url, batch_size=20)
    dispatcher = Dispatcher(engine, registry_of([Brittle(Settings())]), settings)
    try:
        report = dispatcher.run_once()
    finally:
        dispatcher.close()
    assert (report.sent, report.dead) == (9, 1)
    assert outcomes(engine)["boom"] == ("dead", 1, "null provider raised KeyError: 'unexpected'")
    assert NullProvider.channel == Brittle.channel
