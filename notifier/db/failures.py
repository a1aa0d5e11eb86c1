"""The SQL of a campaign's failed recipients: its dead rows and the sent ones the provider later
reported undelivered or bounced, each with its reason. Part of ``notifier.db``, the package that
talks to the driver; ``notifier campaign failures`` and the console's download both read it.

Read a page at a time by keyset on the recipient (``recipient > :after ORDER BY recipient``),
which walks the unique index ``notifications_campaign_recipient`` (campaign_id, recipient): a
page costs the same at the millionth row as at the first, and each page is its own short read,
so a slow reader of the export holds no connection and no snapshot open between pages.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, text

#: Rows per page of the export.
PAGE = 5000

# The attempt history tells the last send; without it (NOTIFIER_RECORD_ATTEMPTS off, or purged
# history) the row's own time: a dead row's death, a bounced row's send.
_FAILED = """
    SELECT n.recipient,
           CASE WHEN n.status = 'dead' THEN 'dead' ELSE n.delivery_status END,
           CASE WHEN n.status = 'dead' THEN n.last_error
                ELSE coalesce(n.delivery_detail, n.delivery_status) END,
           n.attempts,
           coalesce((SELECT max(a.at) FROM notification_attempts a
                      WHERE a.notification_id = n.id AND a.outcome IN ('sent', 'retry', 'dead')),
                    CASE WHEN n.status = 'dead' THEN n.updated_at ELSE n.sent_at END),
           n.id
      FROM notifications n
     WHERE n.campaign_id = :campaign_id {after}
       AND (n.status = 'dead'
            OR (n.status = 'sent' AND n.delivery_status IN ('undelivered', 'bounced')))
     ORDER BY n.recipient
     LIMIT :limit
"""

FIRST_PAGE = text(_FAILED.format(after=""))
NEXT_PAGE = text(_FAILED.format(after="AND n.recipient > :after"))


@dataclass(frozen=True, slots=True)
class Failure:
    """One recipient the campaign did not reach, and why."""

    recipient: str
    #: ``dead``, or the delivery status a provider reported: ``undelivered``, ``bounced``
    status: str
    reason: str
    attempts: int
    last_attempt_at: datetime | None
    id: int


def failed_pages(engine: Engine, campaign_id: int, page: int = PAGE) -> Iterator[list[Failure]]:
    """The campaign's failed recipients in pages of up to ``page``, by recipient; each page
    read on a connection of its own, returned to the pool before the page is handed on."""
    after: str | None = None
    while True:
        params = {"campaign_id": campaign_id, "after": after, "limit": page}
        with engine.connect() as conn:
            rows = conn.execute(FIRST_PAGE if after is None else NEXT_PAGE, params).all()
        if not rows:
            return
        yield [Failure(r[0], r[1], r[2] or "", int(r[3]), r[4], int(r[5])) for r in rows]
        if len(rows) < page:
            return
        after = rows[-1][0]
