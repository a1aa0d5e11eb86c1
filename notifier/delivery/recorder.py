"""Recording a batch: its outcomes, its history and its suppressions in one short transaction
that is retried until it commits, so that a send that happened is not forgotten.

A write that fails because the database went away is retried until the lease runs out (the
rescue owns the rows after that). A write the database refuses for its data is split in halves
down to the row it refuses, which is then recorded plainly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TypeVar
from uuid import UUID

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from notifier.db import queue
from notifier.delivery.outcomes import Plan, Result
from notifier.delivery.prepare import Content
from notifier.models import Attempt, Notification, Transition, truncate
from notifier.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")


class Recorder:
    """Writes what became of one worker's batches."""

    def __init__(self, engine: Engine, settings: Settings, worker: str, content: Content) -> None:
        self.engine = engine
        self.settings = settings
        self.worker = worker
        self.content = content

    def release(
        self,
        token: UUID,
        ids: list[int],
        *,
        not_before: datetime | None = None,
        reason: str | None = None,
    ) -> int:
        return self.write(
            lambda c: queue.release(c, token, ids, not_before=not_before, reason=reason)
        )

    def record(
        self,
        token: UUID,
        decided: Plan,
        history: list[Attempt],
        ended: dict[int, float],
        rows: list[Notification],
        results: dict[int, Result],
    ) -> int:
        worker = self.worker if self.settings.record_attempts else None

        def statements(c: Connection) -> int:
            changed = queue.record_outcomes(c, token, transitions(decided, history, ended), worker)
            self.content.record_suppressions(c, rows, results)
            return changed

        try:
            return self.write(statements)
        except (OperationalError, InterfaceError):
            raise  # the database is gone for longer than the lease: the rescue owns the rows
        except DBAPIError as exc:  # refused for the data: find the row, record the rest
            return self._record_apart(token, decided, history, ended, rows, results, exc)

    def _record_apart(
        self,
        token: UUID,
        decided: Plan,
        history: list[Attempt],
        ended: dict[int, float],
        rows: list[Notification],
        results: dict[int, Result],
        exc: DBAPIError,
    ) -> int:
        """Record a batch whose outcomes the database refused, in halves, down to the row it
        refuses: that row is recorded plainly (its transition, without anything a provider
        wrote), and no row that was sent is left to be sent again."""
        ids = decided.ids()
        if len(ids) > 1:
            halves = (set(ids[: len(ids) // 2]), set(ids[len(ids) // 2 :]))
            return sum(
                self.record(
                    token,
                    decided.only(half),
                    [a for a in history if a.id in half],
                    ended,
                    [n for n in rows if n.id in half],
                    results,
                )
                for half in halves
            )
        # Only the error's kind: its message may quote the very data the database refused.
        kind = type(exc.orig or exc).__name__
        sqlstate = getattr(exc.orig, "sqlstate", None) or "?"
        why = f"its outcome could not be stored ({kind}, SQLSTATE {sqlstate}); see the worker's log"
        log.error("recording notification %s failed: %s", ids, exc)
        plain = decided.plainly(truncate(why))
        try:
            changes = transitions(plain, history, ended)
            return self.write(lambda c: queue.record_outcomes(c, token, changes))
        except DBAPIError:
            log.exception("notification %s: even its plain outcome was refused", ids)
            return 0

    def write(self, statements: Callable[[Connection], T]) -> T:
        """Run one short transaction, retrying until it commits if the database goes away.

        Gives up only when the lease has run out: by then the rescue owns the rows.
        """
        deadline = time.monotonic() + self.settings.lease_seconds
        delay = 0.1
        while True:
            try:
                with self.engine.begin() as conn:
                    return statements(conn)
            except (OperationalError, InterfaceError) as exc:  # connection lost, db restarting
                if time.monotonic() + delay >= deadline:
                    raise
                log.warning("database write failed (%s); retrying in %.1fs", exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)


def transitions(
    decided: Plan, history: Sequence[Attempt], ended: Mapping[int, float]
) -> list[Transition]:
    """The plan's writes, one per attempt of ``history`` (which ``attempts_of`` made from it)."""
    later = {r.id: r for r in (*decided.retries, *decided.deferred)}
    errors = {**{i: r.error for i, r in later.items()}, **decided.dead, **decided.cancelled}
    return [
        Transition(
            a.id,
            a.outcome,
            error=errors.get(a.id),
            at=later[a.id].at if a.id in later else None,
            message_id=decided.sent.get(a.id),
            provider=a.provider,
            sent_at=ended.get(a.id),
            duration_ms=a.duration_ms,
        )
        for a in history
        if a.id in decided.sent or a.id in errors
    ]
