"""Health checks for operators and container healthchecks.

Healthy means PostgreSQL and Redis answer, work is being claimed, and no row is held by a worker
that has stopped (its heartbeat lapsed; see ``notifier.worker.heartbeat``). Waiting work alone is no
fault (a rate-limited campaign may wait for hours); waiting work that nobody has claimed for longer
than a dispatch can take is. With a heartbeat file, the check is about one worker: a worker whose
process is up but which no longer dispatches fails, not only a dead one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import redis
from sqlalchemy import Engine

from notifier.db import errors, workers
from notifier.db.stats import queue_stats
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


def _gone_workers(gone: list[workers.GoneWorker]) -> Check:
    """Rows held by workers whose heartbeat stopped: they wait for the rescue (beat, or any
    worker's dispatch), which should take them within seconds."""
    rows = sum(w.rows for w in gone)
    names = ", ".join(f"{w.name} ({w.rows} rows, silent {w.silent_seconds:.0f}s)" for w in gone[:5])
    more = f" and {len(gone) - 5} more" if len(gone) > 5 else ""
    return Check(
        "workers",
        False,
        f"{rows} rows held by {len(gone)} stopped worker(s): {names}{more};"
        " the rescue returns them (is beat or any worker running?)",
    )


def _one_line(exc: BaseException) -> str:
    """An error's first line: SQLAlchemy's add the statement and a link on lines of their own."""
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), repr(exc))


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
            stats = queue_stats(conn)
            gone = workers.held_by_gone(conn)
        lag = stats.lag_seconds
        checks.append(Check("database", True, f"{stats.due} rows due, lag {lag:.1f}s"))
        if gone:
            checks.append(_gone_workers(gone))
    except Exception as exc:
        problem = errors.diagnose(exc, settings.database_url)
        detail = problem.line if problem is not None else f"unreachable: {_one_line(exc)}"
        checks.append(Check("database", False, detail))
    try:
        raw = cast("bytes | None", client.get(LAST_CLAIM_KEY))
        last_claim = float(raw) if raw is not None else None
        checks.append(Check("redis", True, "answers"))
    except redis.RedisError as exc:
        checks.append(Check("redis", False, f"unreachable: {_one_line(exc)}"))
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
