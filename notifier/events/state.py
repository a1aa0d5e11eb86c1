"""Applying verified reports: a row's delivery state, its history, the suppression list.

Reports arrive late, twice and out of order, so applying one is idempotent and monotonic:

* the row's ``delivery_status`` only moves forward (``model.RANK``: delivered < undelivered =
  bounced < complained; at equal rank the later ``at`` wins), so a delivery reported after the
  bounce that followed it changes nothing;
* its history gets one attempt per (outcome, provider): ``delivered``, ``undelivered``,
  ``bounced`` or ``complained``, at the time the provider gives, the detail as its error;
* a hard bounce, a complaint or an opt-out puts the recipient on the suppression list with a
  reason saying so, of kind ``bounce``, ``complaint`` or ``opt-out``; a soft bounce does not,
  but ``NOTIFIER_SOFT_BOUNCE_LIMIT`` of them within ``NOTIFIER_SOFT_BOUNCE_WINDOW_HOURS`` do. An
  email provider's unsubscribe from a message with a category opts out of that category only;
  an SMS opt-out (STOP, error 21610) is the carrier's and covers everything.

A report applies to its own row: one that names a recipient other than its row's (by the
suppression list's rule) is refused, logged and counted as ``mismatched``, and changes nothing.
What a report suppresses is its row's recipient. A report about a row that no longer exists
(``notifier purge`` deleted it) may still suppress the address it names, and its reason says so.

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
from sqlalchemy import Connection, Engine

from notifier.db import events as queries
from notifier.events.model import DeliveryStatus, Event
from notifier.models import truncate
from notifier.settings import Settings

log = logging.getLogger(__name__)

SOFT_KEY = "notifier:events:soft:"

#: The suppression kind of a report that suppresses, by the state it reports; any other report
#: that suppresses (an unsubscribe, an SMS opt-out such as error 21610) is an ``opt-out``.
_KINDS = {DeliveryStatus.bounced: "bounce", DeliveryStatus.complained: "complaint"}


@dataclass(frozen=True, slots=True)
class Applied:
    """What one report did."""

    #: the row it is about, if one was found
    row_id: int | None
    #: whether the row's delivery state moved
    advanced: bool
    #: whether the suppression list got a new entry
    suppressed: bool
    #: the report names another recipient than its row's, so it changed nothing
    mismatched: bool = False

    @property
    def outcome(self) -> str:
        """How the events metric counts it (``notifier.metrics.EVENT_OUTCOMES``)."""
        if self.mismatched:
            return "mismatched"
        if self.row_id is None:
            return "unmatched"
        return "applied" if self.advanced else "unchanged"


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
                conn, event.channel, event.notification_id, event.provider_message_id,
                event.recipient,
            )  # fmt: skip
            if row is not None and not row.named_matches:
                log.warning(
                    "refused a %s report about row %d: it names another recipient than the row's",
                    event.provider,
                    row.id,
                )
                return Applied(row.id, advanced=False, suppressed=False, mismatched=True)
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
            recipient = row.recipient if row is not None else event.recipient
            reason = event.suppress
            if reason is None and event.soft_bounce and recipient:
                reason = self._soft_bounces(event, recipient, row.id if row else None)
            suppressed = False
            if reason and recipient:
                if row is None and (event.notification_id or event.provider_message_id):
                    reason = f"{reason}; its row is gone"
                    log.info(
                        "a %s report about a row that no longer exists (%s): suppressing the"
                        " address it names",
                        event.provider,
                        event.notification_id or event.provider_message_id,
                    )
                suppressed = self._suppress(conn, event, row, recipient, truncate(reason))
        if suppressed:
            log.info("suppressed a %s recipient: %s", event.channel, reason)
        return Applied(row.id if row is not None else None, advanced, suppressed)

    def opt_out(self, channel: str, recipient: str, category: str, reason: str) -> bool:
        """Opt ``recipient`` out of ``category`` (a one-click unsubscribe), or of everything for
        an empty one (the link of a row without a category that asked for one with
        ``payload.unsubscribe``); whether that is new."""
        with self.engine.begin() as conn:
            if not category:
                return queries.suppress(conn, channel, recipient, truncate(reason), "opt-out")
            return queries.opt_out(conn, channel, recipient, category, truncate(reason))

    @staticmethod
    def _suppress(
        conn: Connection, event: Event, row: queries.Row | None, recipient: str, reason: str
    ) -> bool:
        """Record what the report says: an entry of its kind, or an opt-out of the row's
        category when an email provider reports an unsubscribe from a message that has one."""
        kind = _KINDS.get(event.status, "opt-out") if event.status else "opt-out"
        if event.soft_bounce:
            kind = "bounce"
        if kind == "opt-out" and event.channel == "email" and row is not None and row.category:
            return queries.opt_out(conn, event.channel, recipient, row.category, reason)
        return queries.suppress(conn, event.channel, recipient, reason, kind)

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
