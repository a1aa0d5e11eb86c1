"""``notifier health`` against real PostgreSQL and Redis."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import Engine

from notifier import health
from notifier.cli.main import main
from notifier.settings import Settings
from tests.factories import MakeRow, MakeSettings, SetEnv, ago


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


@pytest.fixture
def quick(make_settings: MakeSettings, tmp_path: Path) -> Settings:
    return make_settings(
        dispatch_interval=1.0,
        dispatch_budget_seconds=1.0,
        smtp_timeout=1.0,
        webhook_timeout=1.0,
        heartbeat_file=tmp_path / "heartbeat",
    )


def _failed(checks: list[health.Check]) -> set[str]:
    return {c.name for c in checks if not c.ok}


def test_waiting_work_that_nobody_claims_is_unhealthy(
    engine: Engine, client: redis.Redis, quick: Settings, make_row: MakeRow
) -> None:
    assert _failed(health.check(engine, client, quick, quick.heartbeat_file)) == set()
    make_row(next_attempt_at=ago(hours=1))
    assert _failed(health.check(engine, client, quick)) == {"claims"}

    client.set(health.LAST_CLAIM_KEY, time.time())  # another worker claims
    health.touch(quick.heartbeat_file)
    stale = time.time() - 3600
    os.utime(quick.heartbeat_file, (stale, stale))  # but this one has not for an hour
    assert _failed(health.check(engine, client, quick, quick.heartbeat_file)) == {"worker"}

    health.touch(quick.heartbeat_file)
    assert _failed(health.check(engine, client, quick, quick.heartbeat_file)) == set()


def test_redis_or_database_down_is_unhealthy(engine: Engine, quick: Settings) -> None:
    down = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1)  # nothing listens
    try:
        assert _failed(health.check(engine, down, quick)) == {"redis"}
    finally:
        down.close()


def test_the_command_exits_non_zero_when_unhealthy(
    database_url: str,
    redis_url: str,
    set_env: SetEnv,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["health"]) == 0
    set_env(redis_url="redis://127.0.0.1:1/0")  # nothing listens there
    assert main(["health"]) == 1
    assert "FAIL  redis" in capsys.readouterr().out
