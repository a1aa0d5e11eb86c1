"""The SQL of the console's lists: notifications a page at a time, and campaigns with their
progress. One row's story is in ``notifier.db.rows``, the counts and gauges of the overview in
``notifier.db.stats``, the workers in ``notifier.db.workers``.

**The list stays fast on a large table** without an index of its own: rows come newest first
by ``id`` (the primary key, walked backwards), a page at a time from the last id shown
(keyset pagination: ``id < :before``), and a filter only drops rows from that walk, so a page
costs what it takes to find its 50 rows. Time ranges become id ranges first (``id_at``): ids
and ``created_at`` grow together, so a range costs a binary search over the primary key, not a
scan. A filter that matches few rows over a long range still walks far: each list query runs
under ``LIST_TIMEOUT``, and the page says to narrow the range.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, text

from notifier.db import bulk
from notifier.db.sql import like_escape

#: Rows per page of the list.
PAGE = 50
#: How long one list query may run.
LIST_TIMEOUT_MS = 5000
#: How much older than its id's neighbours a row's ``created_at`` may be (the longest a
#: producer's transaction stays open between its start and its INSERT); time ranges widen their
#: id range by this much, then filter on ``created_at`` exactly.
CREATED_SKEW = timedelta(hours=1)

# --- the list -----------------------------------------------------------------------------------

_LIST = """
    SELECT n.id, n.status, n.channel, n.provider, n.recipient, n.subject, n.attempts,
           n.max_attempts, n.next_attempt_at, left(n.last_error, 200) AS last_error,
           c.name AS campaign, n.created_at, n.updated_at
      FROM notifications n LEFT JOIN campaigns c ON c.id = n.campaign_id
     WHERE {where}
     ORDER BY {order} DESC
     LIMIT :limit
"""

#: Each filter's condition; only those given are put into the query, so each plan is made for
#: the filters at hand (no ``:x IS NULL OR ...``, which would keep an index from being used).
CONDITIONS = {
    "status": "n.status = :status",
    "channel": "n.channel = :channel",
    "provider": "n.provider = :provider",
    "recipient": "n.recipient = :recipient",
    "dedupe_key": "n.dedupe_key = :dedupe_key",
    # by its id, looked up first: the planner then knows how many rows the campaign has and
    # reads them through notifications_campaign_recipient instead of walking the table
    "campaign_id": "n.campaign_id = :campaign_id",
    # a piece of the error text, ``%`` and ``_`` as themselves (escaped by ``_resolved``)
    "error": "n.last_error ILIKE '%' || :error || '%' ESCAPE '\\'",
    "since": "n.created_at >= :since",
    "until": "n.created_at < :until",
    "min_id": "n.id >= :min_id",
    "max_id": "n.id < :max_id",
    "before": "n.id < :before",
}

FIRST_ID_FROM = text("SELECT id, created_at FROM notifications WHERE id >= :id ORDER BY id LIMIT 1")
ID_RANGE = text("SELECT coalesce(min(id), 0), coalesce(max(id), 0) FROM notifications")
LIST_TIMEOUT = text(f"SET LOCAL statement_timeout = {LIST_TIMEOUT_MS}")


def list_query(params: Mapping[str, Any]) -> Any:
    """The list's statement for the filters in ``params`` (a ``CONDITIONS`` key each)."""
    where = " AND ".join(CONDITIONS[k] for k in CONDITIONS if params.get(k) is not None)
    # A campaign's rows sit together in one stretch of ids, which the planner cannot know: it
    # would walk the primary key from the newest row through every later one. "id + 0" keeps it
    # from ordering by the key, so it reads the campaign's rows by their index and sorts them.
    order = "n.id + 0" if params.get("campaign_id") is not None else "n.id"
    return text(_LIST.format(where=where or "true", order=order))


def list_rows(conn: Connection, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Up to ``params['limit']`` rows matching the filters, newest first; under
    ``LIST_TIMEOUT_MS`` (``OperationalError`` past it). Call inside a transaction."""
    conn.execute(LIST_TIMEOUT)
    given = _resolved(conn, params)
    return [dict(r) for r in conn.execute(list_query(given), given).mappings()]


def explain_list(conn: Connection, params: dict[str, Any]) -> str:
    """The plan of ``list_rows`` for ``params``, as text."""
    given = _resolved(conn, params)
    stmt = text("EXPLAIN " + str(list_query(given)))
    return "\n".join(r[0] for r in conn.execute(stmt, given))


def _resolved(conn: Connection, params: Mapping[str, Any]) -> dict[str, Any]:
    """The given filters, a campaign's name replaced by its id (-1, matching nothing, if none)."""
    given = {k: v for k, v in params.items() if v is not None and k != "campaign"}
    if given.get("error") is not None:
        given["error"] = like_escape(given["error"])
    if params.get("campaign") is not None:
        found = bulk.campaign_id(conn, params["campaign"])
        given["campaign_id"] = -1 if found is None else found
    return given


def id_at(conn: Connection, at: datetime) -> int:
    """The lowest id whose ``created_at`` is at or after ``at - CREATED_SKEW`` (so every row
    created at ``at`` or later has an id at least this), found by a binary search over the
    primary key that assumes ids grow with ``created_at``; one past the highest id if none."""
    low, high = (int(x) for x in conn.execute(ID_RANGE).one())
    high += 1
    cut = at - CREATED_SKEW
    while low < high:  # invariant: the answer is in [low, high]
        mid = (low + high) // 2
        row = conn.execute(FIRST_ID_FROM, {"id": mid}).first()
        if row is None or row[1] >= cut:
            high = mid
        else:
            low = int(row[0]) + 1
    return low


def id_after(conn: Connection, at: datetime) -> int:
    """An id above every row created before ``at`` (see ``id_at``)."""
    return id_at(conn, at + 2 * CREATED_SKEW)


# --- campaigns ----------------------------------------------------------------------------------

# Counts through notifications_campaign_recipient; the rate from the last 10 minutes' attempts.
CAMPAIGNS = text(
    """
    SELECT c.id, c.name, c.channel, c.status, c.created_at, c.launched_at,
           k.enqueued, k.sent, k.retrying, k.dead, k.cancelled, k.waiting,
           (SELECT count(*) FROM notification_attempts a JOIN notifications n
                ON n.id = a.notification_id
             WHERE a.at > now() - interval '10 minutes' AND a.outcome = 'sent'
               AND n.campaign_id = c.id) / 10.0 AS sent_per_minute
      FROM campaigns c
      CROSS JOIN LATERAL (
        SELECT count(*) AS enqueued,
               count(*) FILTER (WHERE status = 'sent') AS sent,
               count(*) FILTER (WHERE status = 'pending' AND attempts > 0) AS retrying,
               count(*) FILTER (WHERE status = 'dead') AS dead,
               count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
               count(*) FILTER (WHERE status IN ('pending', 'processing')) AS waiting
          FROM notifications WHERE campaign_id = c.id) AS k
     ORDER BY c.created_at DESC, c.id DESC
     LIMIT 200
    """
)


def campaigns(conn: Connection) -> list[dict[str, Any]]:
    """The newest 200 campaigns, each with its rows by where they are and its sending rate."""
    return [dict(r) for r in conn.execute(CAMPAIGNS).mappings()]
