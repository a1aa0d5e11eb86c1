"""Applying verified reports: a row's delivery state, its history, the suppression list.

Reports arrive late, twice and out of order, so applying one is idempotent and monotonic:

* the row's ``delivery_status`` only moves forward (``model.RANK``: delivered < undelivered =
  bounced < complained; at equal rank the later ``at`` wins), so a delivery reported after the
  bounce that followed it changes nothing;
* its history gets one attempt per (outcome, provider): ``delivered``, ``undelivered``,
  ``bounced`` or ``complained``, at the time the provider gives, the detail as its error;
* a hard bounce, a complaint or an opt-out puts the recipient on the suppression list with a
  reason saying so; a soft bounce does not, but ``NOTIFIER_SOFT_BOUNCE_LIMIT`` of them within
  ``NOTIFIER_SOFT_BOUNCE_WINDOW_HOURS`` do.

Soft bounces are counted in Redis, one sorted set per recipient (``notifier:events:soft:`` +
SHA-256 of channel and address as suppressions compare it), members the messages that
bounced, scored by time: a report seen twice counts once, and old ones fall out of the window.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass

import redis
from sqlalchemy import Engine

from notifier.db import events as queries
from notifier.events.model import Event
from notifier.models import truncate
from notifier.settings import Settings

log = logging.getLogger(__name__)

SOFT_KEY = "notifier:events:soft:"


@dataclass(frozen=True, slots=True)
class Applied:
    """What one report did."""

    #: the row it is about, if one was found
    row_id: int | None
    #: whether the row's delivery state moved
    advanced: bool
    #: whether the suppression list got a new entry
    suppressed: bool


class Applier:
    """Applies reports with one transaction each."""

    def __init__(self, engine: Engine, client: redis.Redis, settings: Settings) -> None:
        self.engine = engine
        self.redis = client
        self.settings = settings

    def apply_all(self, events: Iterable[Event]) -> list[Applied]:
        return [self.apply(event) for event in events]

    def apply(self, event: Event) -> Applied:
        detail = truncate(event.detail)
        with self.engine.begin() as conn:
            row = queries.lock_row(
                conn, event.channel, event.notification_id, event.provider_message_id
            )
            advanced = False
            if row is not None and event.status is not None:
                queries.append_attempt(
                    conn,
                    row,
                    at=event.at,
                    outcome=event.status.value,
                    error=detail,
                    provider=event.provider,
                )
                advanced = queries.advance(conn, row.id, event.status.value, event.at, detail)
            recipient = event.recipient or (row.recipient if row is not None else None)
            reason = event.suppress
            if reason is None and event.soft_bounce and recipient:
                reason = self._soft_bounces(event, recipient, row.id if row else None)
            suppressed = bool(
                reason
                and recipient
                and queries.suppress(conn, event.channel, recipient, truncate(reason))
            )
        if suppressed:
            log.info("suppressed a %s recipient: %s", event.channel, reason)
        return Applied(row.id if row is not None else None, advanced, suppressed)

    def _soft_bounces(self, event: Event, recipient: str, row_id: int | None) -> str | None:
        """Count this soft bounce; the reason to suppress when the window holds enough."""
        s = self.settings
        address = recipient.strip().lower() if event.channel == "email" else recipient
        key = SOFT_KEY + hashlib.sha256(f"{event.channel}\0{address}".encode()).hexdigest()
        member = f"{event.provider}:{row_id or event.provider_message_id or event.at.isoformat()}"
        window = s.soft_bounce_window_hours * 3600
        now = event.at.timestamp()
        pipe = self.redis.pipeline(transaction=True)
        pipe.zadd(key, {member: now})
        pipe.zremrangebyscore(key, "-inf", now - window)
        pipe.zcard(key)
        pipe.expire(key, int(window) + 1)
        count = int(pipe.execute()[2])
        if count < s.soft_bounce_limit:
            return None
        hours = f"{s.soft_bounce_window_hours:g}h"
        return f"soft bounces: {count} within {hours} (last: {event.detail})"
