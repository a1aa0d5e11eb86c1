"""Health checks for operators and container healthchecks.

Healthy means PostgreSQL and Redis answer and work is being claimed. Waiting work alone is no
fault (a rate-limited campaign may wait for hours); waiting work that nobody has claimed for
longer than a dispatch can take is. With a heartbeat file, the check is about one worker: a
worker whose process is up but which no longer dispatches fails, not only a dead one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import redis
from sqlalchemy import Engine

from notifier import store
from notifier.settings import Settings

#: Redis key holding the Unix time of the last batch that claimed anything, on any worker.
LAST_CLAIM_KEY = "notifier:last_claim"


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str


def touch(path: Path) -> None:
    """Record that this worker has just dispatched (its heartbeat)."""
    try:
        path.touch()
    except OSError:  # a read-only or missing directory must not break dispatching
        return


def stale_after(settings: Settings) -> float:
    """How long due work may wait unclaimed before something is wrong."""
    return settings.dispatch_interval + settings.task_soft_time_limit + 30


def check(
    engine: Engine, client: redis.Redis, settings: Settings, heartbeat: Path | None = None
) -> list[Check]:
    """Database, Redis, recent claims while work waits and, for a worker, its heartbeat."""
    limit = stale_after(settings)
    checks: list[Check] = []
    lag: float | None = None
    last_claim: float | None = None
    try:
        with engine.connect() as conn:
            stats = store.queue_stats(conn)
        lag = stats.lag_seconds
        checks.append(Check("database", True, f"{stats.due} rows due, lag {lag:.1f}s"))
    except Exception as exc:
        checks.append(Check("database", False, f"unreachable: {exc}"))
    try:
        raw = cast("bytes | None", client.get(LAST_CLAIM_KEY))
        last_claim = float(raw) if raw is not None else None
        checks.append(Check("redis", True, "answers"))
    except redis.RedisError as exc:
        checks.append(Check("redis", False, f"unreachable: {exc}"))
    if lag is None or lag <= limit:
        return checks
    now = time.time()
    since = now - last_claim if last_claim is not None else float("inf")
    checks.append(
        Check(
            "claims",
            since <= limit,
            f"rows have waited {lag:.0f}s; last claim {since:.0f}s ago (limit {limit:.0f}s)",
        )
    )
    if heartbeat is not None:
        try:
            age = now - heartbeat.stat().st_mtime
        except OSError:
            age = float("inf")
        checks.append(
            Check(
                "worker",
                age <= limit,
                f"this worker last dispatched {age:.0f}s ago while rows wait (limit {limit:.0f}s)",
            )
        )
    return checks
