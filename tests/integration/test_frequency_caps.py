"""Frequency caps against real PostgreSQL, a real Redis and a real SMTP server: counted per
person across concurrent workers, given back when a send fails, held or cancelled as the
category says, and closed when Redis cannot be reached."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, text

from notifier import client
from notifier.delivery.caps import FrequencyCaps
from notifier.delivery.dispatcher import Dispatcher
from notifier.providers import registry_of
from notifier.providers.email import EmailProvider
from notifier.providers.null import NullProvider
from notifier.settings import Settings, get_settings
from notifier.specs import parse_frequency_caps
from tests.factories import MakeSettings
from tests.smtp_sink import SmtpSink


def sql(engine: Engine, statement: str, **params: object) -> list[tuple[Any, ...]]:
    with engine.begin() as conn:
        result = conn.execute(text(statement), params)
        return [tuple(row) for row in result.all()] if result.returns_rows else []


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    made = redis.Redis.from_url(redis_url, socket_timeout=5)
    yield made
    made.close()


def dispatcher(engine: Engine, settings: Settings, caps: FrequencyCaps) -> Dispatcher:
    providers = registry_of([EmailProvider(get_settings()), NullProvider(Settings())])
    return Dispatcher(engine, providers, settings, caps=caps)


def drain(engine: Engine, settings: Settings, caps: FrequencyCaps) -> None:
    d = dispatcher(engine, settings, caps)
    try:
        d.run_once()
    finally:
        d.close()


def enqueue(engine: Engine, rows: list[dict[str, Any]]) -> None:
    with engine.begin() as conn:
        for n, row in enumerate(rows):
            values = {"subject": "s", "body": "b", "key": f"r{n}", **row}
            client.enqueue(conn, **values)


@pytest.mark.usefixtures("smtp_sink")
def test_a_person_gets_at_most_the_cap_and_other_categories_and_people_pass(
    engine: Engine, settings: Settings, redis_client: redis.Redis
) -> None:
    caps = FrequencyCaps(redis_client, parse_frequency_caps("marketing=2/d"))
    with engine.begin() as conn:
        client.upsert_profile(conn, "u", email="u@example.com")
    enqueue(
        engine,
        [{"channel": "email", "profile": "u", "category": "marketing"}] * 3
        + [{"channel": "email", "profile": "u", "category": "billing"}]
        + [{"channel": "email", "to": "v@example.com", "category": "marketing"}] * 2,
    )

    drain(engine, settings, caps)

    assert sql(engine, "SELECT category, status, last_error FROM notifications ORDER BY id") == [
        ("marketing", "sent", None),
        ("marketing", "sent", None),
        ("marketing", "cancelled", "frequency cap: marketing at most 2/d to one person, reached"),
        ("billing", "sent", None),
        ("marketing", "sent", None),
        ("marketing", "sent", None),
    ]
    # The person's id and address never become a key as written.
    keys = sorted(k.decode() for k in redis_client.keys("notifier:cap:*"))
    assert len(keys) == 2
    assert not any("u" in k.split(":")[-1] and "example" in k for k in keys)


def test_concurrent_workers_share_one_count_per_person(
    engine: Engine, make_settings: MakeSettings, redis_client: redis.Redis
) -> None:
    settings = make_settings(batch_size=3)
    caps = parse_frequency_caps("marketing=4/d")
    with engine.begin() as conn:
        for who in ("a", "b"):
            client.upsert_profile(conn, who, email=f"{who}@example.com")
    enqueue(engine, [{"channel": "null", "to": "x", "profile": who, "category": "marketing"}
                     for who in ("a", "b") for _ in range(15)])  # fmt: skip
    workers = [dispatcher(engine, settings, FrequencyCaps(redis_client, caps)) for _ in range(3)]
    start = threading.Barrier(len(workers))

    def work(d: Dispatcher) -> None:
        start.wait()
        while d.run_once().claimed:
            pass

    threads = [threading.Thread(target=work, args=(d,)) for d in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for d in workers:
        d.close()

    counts = sql(engine, "SELECT profile, status, count(*) FROM notifications GROUP BY 1, 2")
    assert sorted(counts) == [
        ("a", "cancelled", 11), ("a", "sent", 4), ("b", "cancelled", 11), ("b", "sent", 4)
    ]  # fmt: skip


def test_a_send_that_failed_gives_its_place_back_and_wait_holds_without_an_attempt(
    engine: Engine, settings: Settings, redis_client: redis.Redis, smtp_sink: SmtpSink
) -> None:
    caps = FrequencyCaps(redis_client, parse_frequency_caps("digest=1/h:wait"))
    smtp_sink.rcpt_replies["u@example.com"] = "451 4.3.0 try again later"
    with engine.begin() as conn:
        client.upsert_profile(conn, "u", email="u@example.com")
    enqueue(engine, [{"channel": "email", "profile": "u", "category": "digest"}])
    drain(engine, settings, caps)
    assert sql(engine, "SELECT status, attempts FROM notifications") == [("pending", 1)]

    # The retry did not count: the next digest goes, and the one after it waits an hour.
    del smtp_sink.rcpt_replies["u@example.com"]
    sql(engine, "UPDATE notifications SET next_attempt_at = now()")
    drain(engine, settings, caps)
    enqueue(engine, [{"channel": "email", "profile": "u", "category": "digest", "key": "2"}])
    drain(engine, settings, caps)

    rows = sql(engine, "SELECT status, attempts, last_error, next_attempt_at FROM notifications"
                       " ORDER BY id")  # fmt: skip
    assert [row[:2] for row in rows] == [("sent", 2), ("pending", 0)]
    assert rows[1][2].startswith("frequency cap: digest at most 1/h to one person, reached;")
    assert abs(rows[1][3] - (datetime.now(UTC) + timedelta(hours=1))) < timedelta(minutes=2)
    assert sql(engine, "SELECT outcome FROM notification_attempts WHERE notification_id = 2") == [
        ("held",)
    ]


def test_without_redis_capped_rows_wait_and_the_rest_go(
    engine: Engine, settings: Settings, smtp_sink: SmtpSink
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    gone = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, socket_connect_timeout=2)
    with pytest.raises(redis.ConnectionError):
        gone.ping()  # the fault is real before the test relies on it
    caps = FrequencyCaps(gone, parse_frequency_caps("marketing=1/d"))
    enqueue(
        engine,
        [
            {"channel": "email", "to": "a@example.com", "category": "marketing"},
            {"channel": "email", "to": "b@example.com", "category": "billing"},
        ],
    )

    drain(engine, settings, caps)

    rows = sql(engine, "SELECT status, attempts, last_error FROM notifications ORDER BY id")
    assert rows[0][:2] == ("pending", 0)
    assert rows[0][2] == "frequency caps cannot be checked (Redis: ConnectionError); tried again"
    assert rows[1] == ("sent", 1, None)
    assert [m.rcpt_tos for m in smtp_sink.messages] == [["b@example.com"]]


def test_the_caps_grammar_names_what_is_wrong() -> None:
    caps = parse_frequency_caps("marketing=1/d,3/7d;digest=2/h:wait")
    assert (caps["marketing"].args(), caps["marketing"].wait) == (
        [1, 86_400_000, 3, 604_800_000],
        False,
    )
    assert caps["digest"].wait
    for bad, error in [
        ("marketing", "is not category=N/period"),
        ("marketing=1/d:later", "say wait or cancel"),
        ("marketing=1/fortnight", "is not a rate window"),
        ("Marketing=1/d", "is not a category"),
        ("marketing=1/d;marketing=2/d", "capped twice"),
    ]:
        with pytest.raises(ValueError, match=error):
            parse_frequency_caps(bad)
