"""A batch's rows in the database between their claim and their record: the claim, the looks
before sending (cancelled since? campaign paused?), and handing rows back unsent.

Each step is one round trip: the claim is a transaction sent whole (``trips.one_trip``), the
others are single statements in autocommit. Every statement but the claim runs until it is done
(``durable.each_until_done``): the rows are this worker's until their lease ends, and what it
decided about them must not be lost to a database that went away for a moment. The claim is
tried again only for ``CLAIM_RETRY_SECONDS``, past a connection that turned out dead (no ping
precedes it): a claim lost with its connection claimed rows that nobody sends, which wait for
the rescue, never rows sent twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TypeVar
from uuid import UUID

from sqlalchemy import Connection, Engine

from notifier.db import profiles, queue, suppressions
from notifier.db.suppressions import Addressee
from notifier.db.trips import one_trip
from notifier.delivery.batch import BatchReport
from notifier.delivery.durable import each_until_done, until_done
from notifier.delivery.outcomes import Cancelled, Result
from notifier.models import Notification
from notifier.providers import Retry
from notifier.settings import Settings

T = TypeVar("T")

#: How long a claim is tried again while its connection turns out dead.
CLAIM_RETRY_SECONDS = 2.0


class Claims:
    """The claimed rows of one worker process (``worker``, written into ``claimed_by``)."""

    def __init__(self, engine: Engine, settings: Settings, worker: str) -> None:
        self.engine = engine
        self.worker = worker
        self._lease = settings.lease_seconds
        self._read_limits = queue.ReadLimits(settings.max_body_bytes, settings.max_payload_bytes)

    def durably(self, statements: Callable[[Connection], T]) -> T:
        """``statements``, each in autocommit, run again until done (``durable``)."""
        return each_until_done(self.engine, statements, within=self._lease)

    def claim(self, token: UUID, limit: int) -> list[Notification]:
        """Up to ``limit`` due rows, marked ``processing`` under ``token``, their attempt
        counted, in one short transaction."""

        def claim() -> list[Notification]:
            with one_trip(self.engine) as trip:
                cur = queue.send_claim(
                    trip, limit, self._lease, token, self.worker, self._read_limits
                )
            return queue.claimed(cur)

        return until_done(claim, within=CLAIM_RETRY_SECONDS)

    def first_look(
        self, token: UUID, rows: list[Notification], report: BatchReport
    ) -> tuple[list[Notification], dict[Addressee, str]]:
        """``still_wanted`` for rows just claimed, with the suppression list's entries for
        them read in the same round trip (``prepare`` applies them)."""
        if not rows:
            return [], {}
        listed = [n.id for n in rows]
        addressees = {(n.channel, n.recipient, n.category) for n in rows}

        def look() -> tuple[tuple[set[int], set[int]], dict[Addressee, str]]:
            with one_trip(self.engine) as trip:
                held = queue.send_recheck(trip, token, listed)
                stopped = suppressions.send_suppressed(trip, addressees)
            return queue.rechecked(held), suppressions.found_suppressed(stopped)

        (held, paused), stopped = until_done(look, within=self._lease)
        return self._wanted(token, rows, held, paused, report), stopped

    def still_wanted(
        self, token: UUID, rows: list[Notification], report: BatchReport
    ) -> list[Notification]:
        """Drop the rows cancelled since the last look; hand back those of a paused campaign."""
        held, paused = self._recheck(token, (n.id for n in rows))
        return self._wanted(token, rows, held, paused, report)

    def _wanted(
        self,
        token: UUID,
        rows: list[Notification],
        held: set[int],
        paused: set[int],
        report: BatchReport,
    ) -> list[Notification]:
        report.stale += sum(1 for n in rows if n.id not in held)
        if paused:
            report.released += self.durably(lambda c: queue.park_claimed(c, token, paused))
        return [n for n in rows if n.id in held and n.id not in paused]

    def after_guard(self, token: UUID, n: Notification) -> Result | None:
        """Asking a guard took time: the row's result if it was cancelled, or its campaign
        paused, meanwhile; ``None`` if it may be sent."""
        held, paused = self._recheck(token, [n.id])
        if n.id not in held:
            return Cancelled("cancelled while its guard was consulted")
        if n.id in paused:
            return Retry("its campaign was paused while its guard was consulted")
        return None

    def release(
        self,
        token: UUID,
        ids: list[int],
        *,
        not_before: datetime | None = None,
        reason: str | None = None,
    ) -> int:
        """Hand rows back unsent, without using up their attempt; how many were."""
        return self.durably(
            lambda c: queue.release(c, token, ids, not_before=not_before, reason=reason)
        )

    def fan_out(self, token: UUID, rows: list[Notification], report: BatchReport) -> None:
        """Write out push rows to a person (``Notification.to_devices``) as one row per device,
        each ending ``sent`` (``profiles.fan_out``): the devices' rows are claimed and sent
        like any other. A row the claim no longer holds counts as stale."""
        ids = [n.id for n in rows]
        became = list(self.durably(lambda c: profiles.fan_out(c, token, ids, self.worker)).values())
        report.sent += became.count("sent")
        report.dead += became.count("dead")
        report.stale += became.count(None)

    def _recheck(self, token: UUID, ids: Iterable[int]) -> tuple[set[int], set[int]]:
        listed = list(ids)  # read again by every try
        return self.durably(lambda c: queue.recheck(c, token, listed))
