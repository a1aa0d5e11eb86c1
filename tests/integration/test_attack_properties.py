"""Attack by generation: hostile rows and hostile receivers, mixed with good rows, drained by the
real dispatcher against the real database, real webhook receivers and a real SMTP server.

For every generated mix the invariants of docs/guarantees.md must hold:

* the dispatcher never raises;
* every good row is sent exactly once, in the first batch: no hostile row holds one back;
* every hostile row ends (``sent``, ``dead`` or ``cancelled``) within a bounded number of
  dispatches, and a row that did not go out says why (``last_error``);
* no row uses more attempts than it allows;
* no email carries a header its producer did not intend (no ``Bcc``, nothing beyond the headers
  notifier writes and the row's own ``payload.headers``).

The budget is fixed (``NOTIFIER_TEST_ATTACK_EXAMPLES``, 40 by default); with ``CI`` set the
examples are derandomized, so a CI run is repeatable.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from notifier.delivery.dispatcher import Dispatcher
from notifier.delivery.ratelimit import RateLimiter
from notifier.providers import load_registry
from notifier.settings import Settings, get_settings
from tests.factories import SetEnv
from tests.raw_server import RawServer, read_request
from tests.receiver import Receiver
from tests.smtp_sink import SmtpSink

EXAMPLES = int(os.environ.get("NOTIFIER_TEST_ATTACK_EXAMPLES", "40"))
GOOD = 10
MAX_DEFERRALS = 2
#: Headers notifier itself writes on an email; anything else must come from payload.headers.
EMAIL_HEADERS = {
    "from",
    "to",
    "subject",
    "date",
    "message-id",
    "mime-version",
    "content-type",
    "content-transfer-encoding",
    "reply-to",
    # what delivery reports come back by (docs/delivery-feedback.md)
    "x-notifier-id",
    "x-mailgun-variables",
    "x-smtpapi",
    "x-pm-metadata-notifier-id",
    "list-unsubscribe",
    "list-unsubscribe-post",
    "x-peer",
    "x-mailfrom",
    "x-rcptto",
}

# -- what an attacker writes ------------------------------------------------------------------

SEPARATORS = ["\r", "\n", "\r\n", "\x00", "\x0b", "\x0c", "\x1b[2J", "\x85", "\u2028", "\u2029"]
INJECTIONS = [
    "=?utf-8?q?Hi=0D=0ABcc:_evil@example.com?=",
    "=?utf-8?b?SGkNCkJjYzogZXZpbEBleGFtcGxlLmNvbQ==?=",
    "x\r\nBcc: evil@example.com",
    "\u202eevil",
    "{{ 7 * 7 }}",
    "{% for x in range(99999999) %}{% endfor %}",
]


def hostile_text(max_size: int = 60) -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(max_size=max_size),
        st.sampled_from(INJECTIONS),
        st.builds(
            lambda a, s, b: a + s + b,
            st.text(max_size=10),
            st.sampled_from(SEPARATORS),
            st.text(max_size=10),
        ),
        st.integers(3000, 70_000).map(lambda n: "x" * n),
    )


json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


def nested(depth: int) -> str:
    """JSON nested ``depth`` arrays deep, written as text: too deep for ``json.dumps`` itself."""
    return '{"deep": ' + "[" * depth + "]" * depth + "}"


payloads = st.one_of(
    st.dictionaries(st.text(max_size=10), json_values, max_size=5).map(json.dumps),
    json_values.map(json.dumps),
    st.integers(60, 3000).map(nested),
    st.just(json.dumps({"html": "<p>" + "x" * 70_000 + "</p>"})),
    st.dictionaries(
        st.sampled_from(["headers", "html", "title", "data"]),
        st.one_of(st.dictionaries(hostile_text(20), hostile_text(40), max_size=3), hostile_text()),
        max_size=3,
    ).map(json.dumps),
)
timestamps = st.sampled_from(
    [None, "infinity", "-infinity", "294276-01-01", "4713-01-01 BC", "1970-01-01", "2999-01-01"]
)


@st.composite
def hostile_row(draw: st.DrawFn, targets: dict[str, str]) -> dict[str, Any]:
    channel = draw(st.sampled_from(["null", "webhook", "email", "sms-pigeon", "", "null|x\n"]))
    if channel == "webhook":
        recipient = draw(
            st.one_of(
                st.sampled_from(sorted(targets.values())).map(lambda u: u + "/hook"),
                st.sampled_from(
                    ["https://[::1/", "http://127.1/", "https://169.254.169.254/", "ftp://x/", ""]
                ),
                hostile_text(),
            )
        )
    elif channel == "email":
        recipient = draw(
            st.one_of(
                st.just("victim@example.com"), hostile_text(), st.just("a@b.c\r\nBcc: e@x.com")
            )
        )
    else:
        recipient = draw(hostile_text())
    return {
        "channel": channel,
        "recipient": recipient,
        "subject": draw(st.one_of(st.none(), hostile_text())),
        "body": draw(st.one_of(st.none(), hostile_text(), st.just("b" * 1_100_000))),
        "payload": draw(payloads),
        "expires_at": draw(timestamps),
        "created_at": draw(timestamps),
        "guard": draw(st.one_of(st.none(), hostile_text(30))),
        "template": draw(st.one_of(st.none(), hostile_text(30))),
        "locale": draw(st.one_of(st.none(), hostile_text(12))),
        "max_attempts": draw(st.integers(1, 3)),
        "priority": draw(st.integers(-(2**31), 2**31 - 1)),
    }


# -- hostile receivers ------------------------------------------------------------------------


def _answer(status: bytes, headers: bytes = b"", body: bytes = b"") -> Any:
    def behave(conn: socket.socket, _: threading.Event) -> None:
        while read_request(conn) is not None:
            conn.sendall(
                b"HTTP/1.1 "
                + status
                + b"\r\n"
                + headers
                + b"Content-Length: "
                + str(len(body)).encode()
                + b"\r\n\r\n"
                + body
            )

    return behave


def _garbage(conn: socket.socket, _: threading.Event) -> None:
    read_request(conn)
    conn.sendall(b"\x00\x01 not HTTP \xff\r\n\r\n")


RECEIVERS = {
    "nul body": _answer(b"500 Oops", body=b"bad\x00\x1b[2J\xff\xfe"),
    "garbage": _garbage,
    "huge body": _answer(b"503 Busy", body=b"z" * 2_000_000),
    "absurd retry-after": _answer(b"429 Slow", b"Retry-After: " + b"9" * 400 + b"\r\n"),
    "date retry-after": _answer(b"429 Slow", b"Retry-After: Fri, 31 Dec 9999 23:59:59 GMT\r\n"),
    "nul message id": _answer(b"200 OK", b"X-Id: \x00\r\n", b"\x00"),
    "bad status": _answer(b"999 What"),
    "redirect": _answer(b"302 Found", b"Location: http://169.254.169.254/\x00\r\n"),
}


@pytest.fixture
def targets(set_env: SetEnv) -> Iterator[dict[str, str]]:
    set_env(webhook_allow_http=True, webhook_allowed_networks="127.0.0.0/8", webhook_timeout=1)
    servers = {name: RawServer(behave) for name, behave in RECEIVERS.items()}
    good = Receiver().start()
    yield {"good": good.url.removesuffix("/hook"), **{n: s.url for n, s in servers.items()}}
    good.stop()
    for server in servers.values():
        server.stop()


INSERT = text(
    "INSERT INTO notifications (channel, recipient, subject, body, payload, guard, template,"
    " locale, expires_at, created_at, max_attempts, priority, dedupe_key)"
    " VALUES (:channel, :recipient, :subject, :body, CAST(:payload AS jsonb), :guard, :template,"
    " :locale, CAST(:expires_at AS timestamptz),"
    " coalesce(CAST(:created_at AS timestamptz), now()), :max_attempts, :priority, :key)"
)


def _storable(row: dict[str, Any]) -> dict[str, Any]:
    """What PostgreSQL can hold: text columns cannot contain NUL (a producer could not write it
    either), nor jsonb an escaped NUL: NUL becomes the visible U+2400."""
    clean = {k: v.replace("\x00", "\u2400") if isinstance(v, str) else v for k, v in row.items()}
    return {**clean, "payload": row["payload"].replace("\\u0000", "\\u2400")}


@pytest.mark.timeout(600)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_hostile_rows_never_hurt_good_rows(
    data: st.DataObject,
    engine: Engine,
    database_url: str,
    redis_url: str,
    smtp_sink: SmtpSink,
    targets: dict[str, str],
) -> None:
    hostile = data.draw(st.lists(hostile_row(targets), min_size=1, max_size=8), label="hostile")
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE notifications, notification_attempts RESTART IDENTITY"))
        redis.Redis.from_url(redis_url).flushdb()
        smtp_sink.messages.clear()
        good = [{"recipient": f"good-{i}", "key": f"good-{i}"} for i in range(GOOD)]
        rows = [
            {
                "channel": "null",
                "subject": None,
                "body": None,
                "payload": "{}",
                "guard": None,
                "template": None,
                "locale": None,
                "expires_at": None,
                "created_at": None,
                "max_attempts": 1,
                "priority": 0,
                **row,
            }
            for row in good
        ]
        rows += [{**_storable(row), "key": f"hostile-{i}"} for i, row in enumerate(hostile)]
        conn.execute(INSERT, rows)

    limiter = RateLimiter(redis.Redis.from_url(redis_url), {})
    config = Settings(
        database_url=database_url,
        batch_size=100,
        max_deferrals=MAX_DEFERRALS,
        retry_base_seconds=0.01,
        webhook_timeout=1,
    )
    dispatcher = Dispatcher(engine, load_registry(get_settings()), config, limiter=limiter)
    try:
        first = dispatcher.run_once()  # never raises: an exception fails the test here
        with engine.begin() as conn:
            good_after_first = conn.execute(
                text(
                    "SELECT status, attempts, count(*) FROM notifications"
                    " WHERE dedupe_key LIKE 'good-%' GROUP BY 1, 2"
                )
            ).all()
        # Every row due again at once: retries, deferrals and receivers' holds included.
        for _ in range(3 + MAX_DEFERRALS + 1):
            with engine.begin() as conn:
                waiting = conn.execute(
                    text(
                        "UPDATE notifications SET next_attempt_at = now() WHERE status = 'pending'"
                    )
                ).rowcount
            if not waiting:
                break
            redis.Redis.from_url(redis_url).flushdb()
            dispatcher.run_once()
    finally:
        dispatcher.close()

    assert first.claimed == GOOD + len(hostile)
    assert [tuple(r) for r in good_after_first] == [("sent", 1, GOOD)]
    with engine.begin() as conn:
        ended = conn.execute(
            text(
                "SELECT dedupe_key, status, attempts, max_attempts, last_error"
                " FROM notifications WHERE dedupe_key LIKE 'hostile-%'"
            )
        ).all()
    for key, status, attempts, max_attempts, last_error in ended:
        assert status in ("sent", "dead", "cancelled"), (key, status, last_error)
        assert attempts <= max_attempts, (key, attempts, max_attempts)
        if status != "sent":
            assert last_error, (key, status)
            assert last_error.isprintable(), (key, last_error)
    for received in smtp_sink.messages:
        names = {name.lower() for name in received.message}
        intended = {h.lower() for h in _payload_headers(received.message_id, engine)}
        assert names <= EMAIL_HEADERS | intended, (names, received.message["Subject"])
        assert received.message["Bcc"] is None


def _payload_headers(message_id: str, engine: Engine) -> list[str]:
    """The header names the row's own ``payload.headers`` asked for (the row is named by the
    Message-ID notifier gives it: ``<notification-ID@domain>``)."""
    found = re.match(r"<notification-(\d+)@", message_id)
    if found is None:
        return []
    with engine.begin() as conn:
        payload = conn.execute(
            text("SELECT payload FROM notifications WHERE id = :id"), {"id": int(found[1])}
        ).scalar()
    headers = payload.get("headers") if isinstance(payload, dict) else None
    return list(headers) if isinstance(headers, dict) else []
