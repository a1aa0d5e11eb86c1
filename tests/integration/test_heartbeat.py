"""Worker heartbeats and the rescue of a gone worker's rows, against a real PostgreSQL."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
from sqlalchemy import Engine, text

from notifier import health
from notifier.db import queue, rescue
from notifier.settings import Settings
from notifier.worker.heartbeat import Heartbeat
from tests.factories import MakeRows

LEASE = 300


Claimed = Callable[..., list[int]]


@pytest.fixture
def claimed(engine: Engine, make_rows: MakeRows) -> Claimed:
    """``claimed(worker, n=1, **columns)``: ``n`` new rows, claimed by ``worker`` with a
    five-minute lease."""

    def claim(worker: str, n: int = 1, **columns: object) -> list[int]:
        make_rows(n, **columns)
        with engine.begin() as conn:
            rows = queue.claim_due(
                conn, limit=n, lease_seconds=LEASE, token=uuid.uuid4(), worker=worker
            )
        return [row.id for row in rows]

    return claim


def _heartbeat(engine: Engine, name: str, silent: float, grace: float = 15) -> None:
    """A ``workers`` row whose last beat was ``silent`` seconds ago, vouching for ``grace``."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO workers (name, started_at, last_seen, alive_until)"
                " VALUES (:n, now() - interval '1 hour', now() - make_interval(secs => :s),"
                " now() - make_interval(secs => :s) + make_interval(secs => :g))"
            ),
            {"n": name, "s": silent, "g": grace},
        )


def _rows(engine: Engine) -> dict[int, tuple[str, int, str | None]]:
    with engine.connect() as conn:
        return {
            i: (s, r, e)
            for i, s, r, e in conn.execute(
                text("SELECT id, status, rescues, last_error FROM notifications")
            ).all()
        }


def _rescue(engine: Engine) -> dict[str, int]:
    with engine.begin() as conn:
        return rescue.rescue_expired(conn)


def test_a_gone_workers_rows_are_rescued_long_before_their_lease(
    engine: Engine, claimed: Claimed
) -> None:
    gone = claimed("host-a:7:aaaaaa", 2)
    last_try = claimed("host-a:7:aaaaaa", 1, max_attempts=1)
    alive = claimed("host-b:7:bbbbbb", 1)
    older_release = claimed("host-c:7", 1)  # never heartbeats: only the lease counts
    _heartbeat(engine, "host-a:7:aaaaaa", silent=20)
    _heartbeat(engine, "host-b:7:bbbbbb", silent=2)

    assert _rescue(engine) == {"pending": 2, "dead": 1}
    rows = _rows(engine)
    for row in gone:
        status, rescues, error = rows[row]
        assert (status, rescues) == ("pending", 1)
        assert error is not None
        assert error.startswith("worker gone: host-a:7:aaaaaa sent no heartbeat for 20s and")
        assert "stopped before recording the outcome of attempt 1" in error
    assert rows[last_try[0]][0] == "dead"
    assert str(rows[last_try[0]][2]).endswith("; attempts used up")
    for row in alive + older_release:
        assert rows[row][:2] == ("processing", 0)
    with engine.connect() as conn:
        history = conn.execute(
            text("SELECT worker, outcome FROM notification_attempts ORDER BY id")
        ).all()
    assert {tuple(h) for h in history} == {("host-a:7:aaaaaa", "rescued")}
    assert len(history) == 3

    # The older release's row comes back by its lease, as it always did.
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE notifications SET locked_until = now() - interval '1s' WHERE id = :id"),
            {"id": older_release[0]},
        )
    assert _rescue(engine) == {"pending": 1, "dead": 0}
    assert str(_rows(engine)[older_release[0]][2]).startswith("lease expired: worker host-c:7 ")


def test_a_live_worker_busy_in_its_main_thread_keeps_its_rows(
    engine: Engine, database_url: str, claimed: Claimed
) -> None:
    beat = Heartbeat(database_url, "busy:1:cccccc", interval=0.2)
    assert beat.beat()
    beat.start()
    try:
        rows = claimed("busy:1:cccccc", 3)
        # Hold the GIL with pure Python for ten times the grace: the heartbeat still beats.
        until = time.monotonic() + 10 * beat.grace
        while time.monotonic() < until:
            sum(range(1000))
        assert _rescue(engine) == {"pending": 0, "dead": 0}
        assert {_rows(engine)[r][0] for r in rows} == {"processing"}
    finally:
        beat.stop()
    # Stopping says it is gone: what it still held is rescued at once.
    assert _rescue(engine) == {"pending": 3, "dead": 0}


def test_a_worker_gone_for_a_day_is_forgotten(engine: Engine) -> None:
    _heartbeat(engine, "old:1:dddddd", silent=2 * 86400)
    _heartbeat(engine, "recent:1:eeeeee", silent=60)
    _rescue(engine)
    with engine.connect() as conn:
        names = conn.execute(text("SELECT name FROM workers")).scalars().all()
    assert names == ["recent:1:eeeeee"]


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def test_health_names_the_stopped_worker_holding_rows(
    engine: Engine, client: redis.Redis, settings: Settings, claimed: Claimed
) -> None:
    claimed("host-a:7:aaaaaa", 2)
    claimed("host-b:7:bbbbbb", 1)
    _heartbeat(engine, "host-b:7:bbbbbb", silent=1)
    assert [c.name for c in health.check(engine, client, settings) if not c.ok] == []

    _heartbeat(engine, "host-a:7:aaaaaa", silent=40)
    failed = [c for c in health.check(engine, client, settings) if not c.ok]
    assert [c.name for c in failed] == ["workers"]
    assert failed[0].detail.startswith(
        "2 rows held by 1 stopped worker(s): host-a:7:aaaaaa (2 rows, silent 40s);"
    )

    _rescue(engine)
    assert [c.name for c in health.check(engine, client, settings) if not c.ok] == []
