"""The attempt history's weeks: made ahead, dropped whole once past their retention.

``notification_attempts`` is partitioned by week of ``at`` (migration 0027). The weeks are made
and dropped by ``notifier_history_weeks``, a function that runs as the table's owner (workers and
operators may call it, not alter the table): it detaches and drops each week whose every attempt
is older than the retention, deletes such attempts from the default partition (attempts no
week was made for), and makes the weeks to come, moving any of their attempts the default
partition caught. A week whose lock it cannot have within two seconds is left for the next run.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, text

#: Weeks made ahead of this one: the default partition stays empty for two months without a run.
WEEKS_AHEAD = 8

MAINTAIN = text(
    "SELECT week, action, attempts"
    " FROM notifier_history_weeks(:ahead, :keep_days, :dry_run, CAST(:at AS timestamptz),"
    " CAST(:drops AS integer))"
)


@dataclass(frozen=True, slots=True)
class Week:
    """What became of one partition: ``dropped``, ``busy`` (left for the next run), ``deleted``
    (the default partition's old attempts) or ``made``; with the attempts it held."""

    name: str
    action: str
    attempts: int


def maintain(
    conn: Connection,
    keep_days: int,
    *,
    dry_run: bool = False,
    at: datetime | None = None,
    drops: int | None = None,
) -> list[Week]:
    """Drop the weeks past ``keep_days`` (at most ``drops`` of them, the oldest) and make the
    weeks ahead, in ``conn``'s transaction, as of ``at`` (the database's time by default); with
    ``dry_run``, only say what it would do. A dropped week holds the history against every
    writer until the transaction ends: drop one a transaction (``drops=1``) while it is used."""
    params = {
        "ahead": WEEKS_AHEAD,
        "keep_days": keep_days,
        "dry_run": dry_run,
        "at": at,
        "drops": drops,
    }
    found = conn.execute(MAINTAIN, params)
    return [Week(str(name), str(action), int(n)) for name, action, n in found]
