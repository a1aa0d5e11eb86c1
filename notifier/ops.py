"""Day-two operations: what the queue is doing, one row's story, requeue, bulk cancel, purge.

The command line (``notifier.cli.looking``, ``notifier.cli.changes``) and the ``notifier.purge``
task call these; the SQL is in ``notifier.db.stats``, ``notifier.db.rows`` and
``notifier.db.bulk``. A bulk change is two steps, so an operator can confirm what they are
about to change: ``count_*`` returns how many rows match and a ``Snapshot``; ``requeue`` and
``cancel`` then change those rows (the ones that existed at the snapshot), in batches.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine

from notifier.db import bulk, history, rows, status_events
from notifier.db.bulk import Snapshot
from notifier.db.sql import like_escape
from notifier.db.stats import QueueStats, outcomes_per_minute, queue_stats
from notifier.models import Status
from notifier.settings import Settings

log = logging.getLogger(__name__)

#: Rows per statement and transaction of a bulk change.
BATCH_SIZE = 5000
#: Walks over the table a bulk change makes at most: rows a worker held locked at that moment
#: are skipped and found again by the next walk.
PASSES = 3
#: The finished statuses ``purge`` deletes, each with its retention setting.
RETENTION = {
    Status.sent: "retention_sent_days",
    Status.dead: "retention_dead_days",
    Status.cancelled: "retention_cancelled_days",
}

Progress = Callable[[int], None]


# --- looking ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Minute:
    """The attempts of one minute, from the attempt history."""

    start: datetime
    sent: int
    retry: int
    dead: int
    #: the minute under way: its counts are still growing
    partial: bool


@dataclass(frozen=True, slots=True)
class Stats:
    queue: QueueStats
    minutes: list[Minute]
    #: the status webhook's outbox: pending, processing and dead events
    status_events: status_events.Counts

    @property
    def sent_per_minute(self) -> float:
        """Mean over the whole minutes."""
        whole = [m.sent for m in self.minutes if not m.partial]
        return sum(whole) / len(whole) if whole else 0.0


def stats(engine: Engine, minutes: int = 5) -> Stats:
    """Rows by status and channel, due rows and lag, and the outcomes of the last minutes."""
    with engine.connect() as conn:
        queue = queue_stats(conn)
        per_minute = outcomes_per_minute(conn, minutes)
        events = status_events.counts(conn)
    last = len(per_minute) - 1
    return Stats(
        queue,
        [Minute(m, s, r, d, partial=i == last) for i, (m, s, r, d) in enumerate(per_minute)],
        events,
    )


@dataclass(frozen=True, slots=True)
class Story:
    """One notification and every attempt made at it, oldest first."""

    row: dict[str, Any]
    attempts: list[dict[str, Any]]


#: The columns ``show`` tells, in this order (``campaign`` by its name).
SHOWN = (
    "id",
    "status",
    "channel",
    "recipient",
    "subject",
    "body",
    "payload",
    "dedupe_key",
    "priority",
    "attempts",
    "max_attempts",
    "next_attempt_at",
    "expires_at",
    "guard",
    "last_error",
    "provider_message_id",
    "rescues",
    "claimed_by",
    "locked_until",
    "campaign",
    "producer",
    "created_at",
    "updated_at",
    "sent_at",
)


def show(engine: Engine, row_id: int) -> Story | None:
    with engine.connect() as conn:
        row = rows.notification(conn, row_id)
        if row is None:
            return None
        return Story({k: row[k] for k in SHOWN}, rows.history(conn, row_id))


# --- requeue and cancel -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeadFilter:
    """Which dead rows to requeue; ``None`` or empty matches all. Times are when they died."""

    ids: list[int] = field(default_factory=list)
    channels: list[str] = field(default_factory=list)
    since: datetime | None = None
    until: datetime | None = None
    #: a piece of ``last_error``, matched ignoring case
    error: str | None = None
    #: a campaign's name (its id, looked up, goes to ``params``)
    campaign: str | None = None

    def params(self, snap: Snapshot, campaign_id: int | None = None) -> dict[str, Any]:
        # Only rows already dead at the snapshot: a requeued row that dies again during the run
        # is not requeued a second time.
        until = snap.now if self.until is None else min(self.until, snap.now)
        return {
            "max_id": snap.max_id,
            "ids": self.ids or None,
            "channels": self.channels or None,
            "campaign_id": campaign_id,
            "since": self.since,
            "until": until,
            "error": None if self.error is None else like_escape(self.error),
        }


@dataclass(frozen=True, slots=True)
class WaitingFilter:
    """Which unsent rows to cancel. Times are when they were created."""

    statuses: tuple[str, ...] = (Status.pending, Status.processing)
    channels: list[str] = field(default_factory=list)
    campaign: str | None = None
    since: datetime | None = None
    until: datetime | None = None


@dataclass(frozen=True, slots=True)
class Change:
    """What a bulk change did."""

    changed: int
    #: rows that still matched after the last walk (held by someone else each time)
    left: int


def count_requeue(engine: Engine, f: DeadFilter) -> tuple[int, Snapshot]:
    """How many dead rows ``f`` matches now, and the snapshot ``requeue`` takes them from.

    Raises ``ValueError`` for a campaign that does not exist.
    """
    with engine.begin() as conn:
        snap = bulk.snapshot(conn)
        return bulk.count_dead(conn, f.params(snap, campaign_id(conn, f.campaign))), snap


def requeue(
    engine: Engine,
    f: DeadFilter,
    snap: Snapshot,
    *,
    batch_size: int = BATCH_SIZE,
    progress: Progress | None = None,
) -> Change:
    """Matching dead rows -> ``pending``, due now, attempts reset to 0 (``last_error`` kept)."""
    with engine.connect() as conn:
        params = f.params(snap, campaign_id(conn, f.campaign))
    return _in_batches(
        engine,
        lambda c, after: bulk.requeue_dead(c, params, after, batch_size),
        lambda c: bulk.count_dead(c, params),
        batch_size,
        progress,
    )


def count_cancel(engine: Engine, f: WaitingFilter) -> tuple[int, Snapshot]:
    """How many unsent rows ``f`` matches now, and the snapshot ``cancel`` takes them from.

    Raises ``ValueError`` for a campaign that does not exist.
    """
    with engine.begin() as conn:
        snap = bulk.snapshot(conn)
        return bulk.count_waiting(conn, _waiting_params(conn, f, snap)), snap


def cancel(
    engine: Engine,
    f: WaitingFilter,
    snap: Snapshot,
    reason: str,
    *,
    batch_size: int = BATCH_SIZE,
    progress: Progress | None = None,
) -> Change:
    """Matching unsent rows -> ``cancelled`` with ``reason`` as their ``last_error``."""
    with engine.connect() as conn:
        params = _waiting_params(conn, f, snap)
    return _in_batches(
        engine,
        lambda c, after: bulk.cancel_waiting(c, params, reason, after, batch_size),
        lambda c: bulk.count_waiting(c, params),
        batch_size,
        progress,
    )


def campaign_id(conn: Connection, name: str | None) -> int | None:
    """The id of the campaign named ``name`` (``None`` for no name); ``ValueError`` if there
    is no such campaign."""
    if name is None:
        return None
    found = bulk.campaign_id(conn, name)
    if found is None:
        raise ValueError(f"no campaign named {name!r}")
    return found


def _waiting_params(conn: Connection, f: WaitingFilter, snap: Snapshot) -> dict[str, Any]:
    return {
        "max_id": snap.max_id,
        "statuses": [str(s) for s in f.statuses],
        "channels": f.channels or None,
        "campaign_id": campaign_id(conn, f.campaign),
        "since": f.since,
        "until": f.until,
    }


def _in_batches(
    engine: Engine,
    batch: Callable[[Connection, int], list[int]],
    remaining: Callable[[Connection], int],
    batch_size: int,
    progress: Progress | None,
) -> Change:
    """Walk the matching rows by id, one short transaction per batch, until none are left or
    ``PASSES`` walks have been made."""
    changed = left = 0
    for walk in range(PASSES):
        after = 0
        while True:
            with engine.begin() as conn:
                ids = batch(conn, after)
            changed += len(ids)
            if progress is not None and ids:
                progress(changed)
            if len(ids) < batch_size:  # SKIP LOCKED skips, LIMIT counts what it locked
                break
            after = max(ids)
        with engine.connect() as conn:
            left = remaining(conn)
        if not left:
            break
        time.sleep(0.2 * (walk + 1))  # the locks we met belong to transactions of milliseconds
    return Change(changed, left)


# --- purge ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class Purge:
    """What a purge deleted (or, in a dry run, would delete)."""

    #: rows that finished before these times, by status
    before: dict[str, datetime]
    deleted: dict[str, int]
    #: attempts dropped with their weeks of history (``history.maintain``)
    attempts: int = 0
    #: the highest id deleted: where a purge that ran out of time resumes
    last_id: int = 0
    #: False when ``budget_seconds`` ran out before every expired row was deleted
    finished: bool = True
    dry_run: bool = False
    #: the status webhook's sent and dead events deleted (not counted by a dry run)
    status_events: int = 0


def purge(
    engine: Engine,
    settings: Settings,
    *,
    dry_run: bool = False,
    batch_size: int = BATCH_SIZE,
    budget_seconds: float | None = None,
    after: int = 0,
    progress: Progress | None = None,
) -> Purge:
    """Delete finished rows past their status's retention and the status webhook's sent and
    dead events past the same retention; then drop the weeks of attempt history past
    ``NOTIFIER_RETENTION_HISTORY_DAYS`` and make the weeks ahead (``history.maintain``).

    A row is past retention when its ``updated_at`` (when it became sent, dead or cancelled)
    is older than ``NOTIFIER_RETENTION_<STATUS>_DAYS``. ``pending`` and ``processing`` rows are
    never touched. Batches of ``batch_size`` rows, each its own transaction, walk the table by
    id from ``after``; with ``budget_seconds``, no batch starts after it (``finished`` is then
    False and ``last_id`` says where to resume).
    """
    started = time.monotonic()
    with engine.connect() as conn:
        now = bulk.snapshot(conn).now
        before = {
            str(s): now - timedelta(days=getattr(settings, name)) for s, name in RETENTION.items()
        }
        if dry_run:
            deleted = bulk.count_expired(conn, before)
            weeks = history.maintain(conn, settings.retention_history_days, dry_run=True)
            return Purge(before, _by_status(deleted), _dropped(weeks), after, dry_run=True)
    result = Purge(before, _by_status({}), last_id=after)
    while True:
        if budget_seconds is not None and time.monotonic() - started >= budget_seconds:
            result.finished = False
            break
        with engine.begin() as conn:
            deleted, last = bulk.purge_expired(conn, before, result.last_id, batch_size)
        for status, n in deleted.items():
            result.deleted[status] += n
        result.last_id = last
        if progress is not None:
            progress(sum(result.deleted.values()))
        if sum(deleted.values()) < batch_size:
            break
    while result.finished:  # the status webhook's events, by the same cut-offs
        with engine.begin() as conn:
            n = status_events.purge(conn, before, batch_size)
        result.status_events += n
        if n < batch_size:
            break
    while result.finished:  # weeks, not rows: one a transaction, whatever it holds
        with engine.begin() as conn:
            weeks = history.maintain(conn, settings.retention_history_days, drops=1)
        result.attempts += _dropped(weeks)
        if not any(w.action == "dropped" for w in weeks):
            break
    log.info(
        "purge sent=%d dead=%d cancelled=%d attempts=%d status_events=%d finished=%s took=%.1fs",
        *(result.deleted[str(s)] for s in RETENTION),
        result.attempts,
        result.status_events,
        result.finished,
        time.monotonic() - started,
        extra={
            "event": "purge",
            **{str(s): result.deleted[str(s)] for s in RETENTION},
            "attempts": result.attempts,
            "status_events": result.status_events,
            "finished": result.finished,
            "took": round(time.monotonic() - started, 3),
        },
    )
    return result


def _dropped(weeks: list[history.Week]) -> int:
    """Attempts the weeks dropped (or would drop) held, and the default partition's deleted."""
    return sum(w.attempts for w in weeks if w.action in ("dropped", "deleted"))


def _by_status(counts: dict[str, int]) -> dict[str, int]:
    return {str(s): counts.get(str(s), 0) for s in RETENTION}
