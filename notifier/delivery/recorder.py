"""Recording a batch's decisions: their transitions, their history and their suppressions in one
short transaction sent in one round trip (``trips.one_trip``), run until it commits, so that a
send that happened is not forgotten.

A write that fails because the database went away is retried until the lease runs out (the
rescue owns the rows after that; see ``durable``). A write the database refuses for its data is
split in halves down to the row it refuses, which is then recorded plainly.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from uuid import UUID

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from notifier.db import queue, suppressions
from notifier.db.trips import one_trip
from notifier.delivery.durable import until_committed, until_done
from notifier.delivery.outcomes import Plan
from notifier.models import Decision, truncate

log = logging.getLogger(__name__)


class Recorder:
    """Writes what became of one worker's batches. ``worker`` names the attempts it appends to
    the history; ``None`` appends none (``NOTIFIER_RECORD_ATTEMPTS=false``)."""

    def __init__(self, engine: Engine, worker: str | None, *, within: float) -> None:
        self.engine = engine
        self.worker = worker
        self.within = within

    def record(self, token: UUID, decided: Plan) -> int:
        """Record ``decided`` for the rows ``token`` still holds; how many it changed."""

        def statements() -> int:
            decisions = decided.decisions
            with one_trip(self.engine) as trip:  # the outcomes and suppressions, one round trip
                changed = queue.send_record(trip, token, decisions, self.worker)
                added = suppressions.send_suppress_many(trip, _suppressions(decisions))
            _log_suppressed(suppressions.added(added))
            return queue.recorded(changed)

        try:
            return until_done(statements, within=self.within)
        except (OperationalError, InterfaceError):
            raise  # the database is gone for longer than the lease: the rescue owns the rows
        except DBAPIError as exc:  # refused for the data: find the row, record the rest
            return self._record_apart(token, decided, exc)

    def _record_apart(self, token: UUID, decided: Plan, exc: DBAPIError) -> int:
        """Record a batch whose outcomes the database refused, in halves, down to the row it
        refuses: that row is recorded plainly (its transition, without anything a provider
        wrote), and no row that was sent is left to be sent again."""
        ids = decided.ids()
        if len(ids) > 1:
            halves = (ids[: len(ids) // 2], ids[len(ids) // 2 :])
            return sum(self.record(token, decided.only(half)) for half in halves)
        # Only the error's kind: its message may quote the very data the database refused.
        kind = type(exc.orig or exc).__name__
        sqlstate = getattr(exc.orig, "sqlstate", None) or "?"
        why = f"its outcome could not be stored ({kind}, SQLSTATE {sqlstate}); see the worker's log"
        log.error("recording notification %s failed: %s", ids, exc)
        plain = decided.plainly(truncate(why)).decisions  # and no history: it may be refused too
        try:
            return until_committed(
                self.engine,
                lambda c: queue.record_outcomes(c, token, plain),
                within=self.within,
            )
        except DBAPIError:
            log.exception("notification %s: even its plain outcome was refused", ids)
            return 0


def record_suppressions(conn: Connection, decisions: Sequence[Decision]) -> int:
    """Suppress the recipients that decisions carry (a provider refused them for good); how
    many were new."""
    return _log_suppressed(suppressions.suppress_many(conn, _suppressions(decisions)))


def _suppressions(decisions: Sequence[Decision]) -> list[tuple[str, str, str, str]]:
    return [d.suppress for d in decisions if d.suppress]


def _log_suppressed(added: int) -> int:
    if added:
        log.info("suppressed %d recipients after hard bounces", added)
    return added
