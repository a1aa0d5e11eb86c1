"""Stopping a worker and losing Redis, for real: nothing is lost and no attempt is used up."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest
import redis
from sqlalchemy import Engine, text

from tests.acceptance.conftest import Services, wait_for
from tests.factories import MakeRows
from tests.receiver import Receiver
from tests.redis_server import RedisServer


@pytest.fixture
def receiver(services: Services) -> Iterator[Receiver]:
    r = Receiver().start()
    services.env.update(
        NOTIFIER_WEBHOOK_ALLOW_HTTP="true",
        NOTIFIER_WEBHOOK_ALLOWED_NETWORKS="127.0.0.0/8",
        NOTIFIER_BATCH_SIZE="20",
        NOTIFIER_SEND_CONCURRENCY="2",
        NOTIFIER_ASYNC_SEND_CONCURRENCY="2",  # webhook sends run on the event loop
    )
    yield r
    r.stop()


def _by_status(engine: Engine) -> dict[tuple[str, int], int]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT status, attempts, count(*) FROM notifications GROUP BY 1, 2")
        ).all()
    return {(s, a): n for s, a, n in rows}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sigterm_finishes_sends_under_way_and_hands_back_the_rest(
    engine: Engine, make_rows: MakeRows, services: Services, receiver: Receiver
) -> None:
    receiver.delay = 3.0
    make_rows(20, channel="webhook", recipient=receiver.url, subject=lambda i: f"n{i}")
    worker = services.worker(concurrency=1)
    services.beat()
    wait_for(lambda: len(receiver.deliveries) == 0 and _by_status(engine).get(("processing", 1), 0)
             == 20, 30, "one batch of 20 to be claimed")  # fmt: skip
    time.sleep(1.0)  # two sends are now under way at the receiver

    os.kill(worker.pid, signal.SIGTERM)
    signalled = time.monotonic()
    wait_for(lambda: _by_status(engine).get(("pending", 0), 0) == 18, 5, "18 rows handed back")
    handed_back = time.monotonic() - signalled
    worker.wait(timeout=60)
    assert worker.returncode is not None  # the worker really stopped

    assert handed_back < 1.5
    assert len(receiver.deliveries) == 2  # the two sends under way were finished, not cut
    assert _by_status(engine) == {("sent", 1): 2, ("pending", 0): 18}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_redis_down_stops_sending_and_burns_no_attempts(
    engine: Engine,
    make_rows: MakeRows,
    services: Services,
    receiver: Receiver,
    redis_server: RedisServer | None,
) -> None:
    if redis_server is None:
        pytest.skip("stopping Redis needs the test run's own server (NOTIFIER_TEST_REDIS is set)")
    receiver.delay = 0.05
    make_rows(1500, channel="webhook", recipient=receiver.url, subject=lambda i: f"n{i}")
    services.worker(concurrency=2)
    services.beat()
    wait_for(lambda: len(receiver.deliveries) >= 200, 60, "the drain to be under way")

    redis_server.stop()
    down_at = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        redis.Redis(port=redis_server.port, socket_timeout=2).ping()
    try:
        time.sleep(30)
        late = [d for d in receiver.deliveries if d[1] > down_at + 1.0]
        during = _by_status(engine)
    finally:
        redis_server.start()

    assert late == []  # nothing was sent while Redis was down
    assert during.get(("processing", 1), 0) == 0  # claimed rows were handed back
    assert {a for (s, a) in during if s == "pending"} <= {0}  # no attempt was used up
    wait_for(lambda: set(_by_status(engine)) == {("sent", 1)}, 120, "the backlog to drain")
    assert sum(receiver.counts().values()) == 1500
    assert set(receiver.counts().values()) == {1}
