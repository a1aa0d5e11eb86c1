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

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from notifier.db import queue, suppressions
from notifier.db.trips import one_trip
from notifier.delivery.durable import until_done
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

        try:
            return self._write(token, decided.decisions, self.worker)
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
            return self._write(token, plain, None)
        except DBAPIError:
            log.exception("notification %s: even its plain outcome was refused", ids)
            return 0

    def _write(self, token: UUID, decisions: Sequence[Decision], worker: str | None) -> int:
        """The decisions' transitions, their history when ``worker`` is named, and the
        suppressions they carry, in one transaction sent in one round trip, run again while the
        database is away; how many rows it changed."""

        def trip() -> int:
            entries = [d.suppress for d in decisions if d.suppress]
            with one_trip(self.engine) as conn:
                changed = queue.send_record(conn, token, decisions, worker)
                suppressing = suppressions.send_suppress_many(conn, entries)
            added = suppressions.added(suppressing)
            if added:
                log.info("suppressed %d recipients after hard bounces", added)
            return queue.recorded(changed)

        return until_done(trip, within=self.within)
