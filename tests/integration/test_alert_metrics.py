"""The series the alerting rules read that the dashboard does not: whether the metrics endpoint
could reach PostgreSQL and Redis at a scrape, and the rows rescued from workers that died."""

from __future__ import annotations

import socket
import uuid

import pytest
import redis
from sqlalchemy import Engine, text

from notifier import db, metrics
from notifier.db import queue, rescue
from tests.factories import MakeRow
from tests.prometheus import Samples, samples, scrape

LABELS = metrics.Labels(frozenset({"null"}), frozenset({"null"}))


def _free_port() -> int:
    """A loopback port nothing listens on: a dependency that is down, while the run's own stay
    up for the other tests."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _up(found: Samples, dependency: str) -> float:
    return found[("notifier_dependency_up", (("dependency", dependency),))]


@pytest.mark.timeout(60)
def test_both_dependencies_up_when_both_answer(engine: Engine, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    found = samples(scrape(engine, client, LABELS))
    client.close()
    assert _up(found, "postgres") == 1
    assert _up(found, "redis") == 1
    assert ("notifier_due", ()) in found


@pytest.mark.timeout(60)
def test_redis_down_is_said_outright_and_the_gauges_still_come(engine: Engine) -> None:
    client = redis.Redis(port=_free_port(), socket_connect_timeout=1, socket_timeout=1)
    found = samples(scrape(engine, client, LABELS))
    assert _up(found, "redis") == 0
    assert _up(found, "postgres") == 1
    assert ("notifier_due", ()) in found
    assert not [k for k in found if k[0] == "notifier_attempts_total"]


@pytest.mark.timeout(60)
def test_postgres_down_is_said_outright_and_the_counters_still_come(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.hset(metrics.ATTEMPTS_KEY, "null|null|sent", "2")
    nowhere = db.make_engine(
        f"postgresql+psycopg://postgres@127.0.0.1:{_free_port()}/notifier?connect_timeout=2"
    )
    found = samples(scrape(nowhere, client, LABELS))
    client.close()
    nowhere.dispose()
    assert _up(found, "postgres") == 0
    assert _up(found, "redis") == 1
    assert ("notifier_due", ()) not in found
    sent = (("channel", "null"), ("outcome", "sent"), ("provider", "null"))
    assert found[("notifier_attempts_total", sent)] == 2


@pytest.mark.timeout(60)
def test_rows_rescued_from_a_dead_worker_are_counted_for_an_hour(
    engine: Engine, make_row: MakeRow, redis_url: str
) -> None:
    for recipient in ("a", "b", "c"):
        make_row(channel="null", recipient=recipient)
    with engine.begin() as conn:
        queue.claim_due(conn, limit=2, lease_seconds=60, token=uuid.uuid4(), worker="gone")
        conn.execute(text("UPDATE notifications SET locked_until = now() - interval '1s'"))
        assert rescue.rescue_expired(conn) == {"pending": 2, "dead": 0}
    client = redis.Redis.from_url(redis_url)
    assert samples(scrape(engine, client, LABELS))[("notifier_rescued_last_hour", ())] == 2

    with engine.begin() as conn:  # one of them was rescued long ago: no longer counted
        conn.execute(
            text(
                "UPDATE notification_attempts SET at = now() - interval '61 minutes'"
                " WHERE id = (SELECT min(id) FROM notification_attempts)"
            )
        )
    assert samples(scrape(engine, client, LABELS))[("notifier_rescued_last_hour", ())] == 1
    client.close()
