"""The shared rate limiter against a real Redis, from several processes, and the dispatcher."""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, text

from notifier.delivery.dispatcher import Dispatcher
from notifier.delivery.ratelimit import RateLimiter
from notifier.providers import load_registry
from notifier.settings import Settings, get_settings
from notifier.specs import parse_limits
from tests.factories import MakeRows, MakeSettings


def _take_for(url: str, spec: str, seconds: float, ready: Any, go: Any, results: Any) -> None:
    limiter = RateLimiter(redis.Redis.from_url(url), parse_limits(spec))
    ready.put(1)
    go.wait()  # all processes begin together
    granted = 0
    started = time.time()
    while time.time() < started + seconds:
        got, wait = limiter.acquire("sms", 10)
        granted += got
        if got < 10:
            time.sleep(min(wait, 0.01))
    results.put((granted, started, time.time()))


def _granted_by_processes(
    url: str, spec: str, seconds: float, processes: int = 4
) -> tuple[int, float]:
    """Sends granted to processes asking as fast as they can, and the seconds they spanned."""
    ctx = multiprocessing.get_context("spawn")
    ready, go, results = ctx.Queue(), ctx.Event(), ctx.Queue()
    args = (url, spec, seconds, ready, go, results)
    procs = [ctx.Process(target=_take_for, args=args) for _ in range(processes)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=60)
    go.set()
    runs = [results.get(timeout=seconds + 60) for _ in procs]
    for p in procs:
        p.join(timeout=10)
    span = max(r[2] for r in runs) - min(r[1] for r in runs)
    return sum(r[0] for r in runs), span


def test_one_limit_is_shared_by_every_process(redis_url: str) -> None:
    granted, span = _granted_by_processes(redis_url, "sms=200/s", 3.0)
    # 200/s over the time the processes spanned, plus one burst of 20.
    assert 200 * 3.0 * 0.95 <= granted <= 200 * span + 20 + 1


def test_the_tightest_window_wins(redis_url: str) -> None:
    granted, span = _granted_by_processes(redis_url, "sms=1000/s,150/10s", 2.0, processes=2)
    assert 150 <= granted <= 150 + 15 * span + 1  # the 10 s window's burst, then 15/s


def test_block_holds_every_worker_back(redis_url: str) -> None:
    limiter = RateLimiter(redis.Redis.from_url(redis_url), parse_limits("sms=100/s"))
    assert limiter.acquire("sms", 5)[0] == 5
    limiter.block("sms", 1.0)
    granted, wait = limiter.acquire("sms", 5)
    assert granted == 0
    assert 0.9 <= wait <= 1.1
    time.sleep(1.1)
    assert limiter.acquire("sms", 5)[0] == 5


def test_unlimited_providers_need_no_redis() -> None:
    nowhere = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1)
    try:
        assert RateLimiter(nowhere, {}).acquire("email", 50) == (50, 0.0)
    finally:
        nowhere.close()


def test_the_dispatcher_sends_at_the_limit(
    engine: Engine, make_settings: MakeSettings, make_rows: MakeRows, redis_url: str
) -> None:
    make_rows(600, recipient=lambda i: f"x{i}")
    limiter = RateLimiter(redis.Redis.from_url(redis_url), parse_limits("null=200/s"))
    dispatcher = Dispatcher(
        engine,
        load_registry(get_settings()),
        make_settings(batch_size=600),
        limiter=limiter,
    )
    started = time.monotonic()
    report = dispatcher.run_once()
    took = time.monotonic() - started
    dispatcher.close()
    assert report.sent == 600
    assert 2.5 <= took <= 4.0  # 20 at once, then 200/s


def test_rows_the_limit_does_not_grant_in_time_wait_without_using_an_attempt(
    engine: Engine, make_settings: MakeSettings, make_rows: MakeRows, redis_url: str
) -> None:
    make_rows(100, recipient=lambda i: f"x{i}")
    limiter = RateLimiter(redis.Redis.from_url(redis_url), parse_limits("null=10/s"))
    dispatcher = Dispatcher(
        engine,
        load_registry(get_settings()),
        make_settings(batch_size=100),
        limiter=limiter,
    )
    report = dispatcher.run_once(deadline=time.monotonic() + 1.0)
    dispatcher.close()
    assert 10 <= report.sent <= 13  # one burst, then about a second at 10/s
    assert report.released == 100 - report.sent
    with engine.connect() as conn:
        waiting = conn.execute(
            text("SELECT count(*), max(attempts) FROM notifications WHERE status = 'pending'")
        ).one()
    assert tuple(waiting) == (100 - report.sent, 0)


def test_without_redis_nothing_is_sent_and_nothing_is_lost(
    engine: Engine, settings: Settings, make_rows: MakeRows
) -> None:
    make_rows(20, recipient=lambda i: f"x{i}")
    nowhere = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1)
    with pytest.raises(redis.ConnectionError):
        nowhere.ping()  # the fault is real: nothing listens there
    limiter = RateLimiter(nowhere, parse_limits("null=100/s"))
    report = Dispatcher(engine, load_registry(get_settings()), settings, limiter=limiter).run_once()
    nowhere.close()
    assert (report.claimed, report.sent, report.released) == (20, 0, 20)
    assert report.paused is not None
    assert "rate limiter unavailable" in report.paused
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT status, attempts, count(*) FROM notifications GROUP BY 1, 2")
        ).all()
    assert [tuple(r) for r in rows] == [("pending", 0, 20)]
