"""Launching a campaign: one notification per recipient, written in set-based chunks.

A launch holds the campaign's session lock (a second launch waits for it), marks the campaign
``launching``, checks every recipient has what the message needs (its fields, a free code), and
writes the positions no earlier chunk wrote, ``PARALLEL`` chunks at a time, each chunk one
statement and one transaction recorded with its rows. Re-running it after a crash finishes it
without a second row or a second code for anyone (see ``notifier.db.launches``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from notifier.campaigns.messages import (
    BUILT_IN,
    TEMPLATE_BUILT_IN,
    CampaignError,
    placeholders,
    render_sql,
    template_variables,
)
from notifier.db import campaigns as campaigns_db
from notifier.db import launches
from notifier.db.campaigns import CampaignRow
from notifier.models import CampaignStatus

#: Recipients written per fan-out statement (and per transaction).
CHUNK = 50_000
#: Fan-out statements run at once, each on a connection of its own: the database's work per
#: row (heap and index writes) is what a launch waits on, and it spreads over server cores.
PARALLEL = 2
#: The most a launch may ask for: ``db.engine``'s pool holds 4 connections, and one holds
#: the launch's lock.
MOST_PARALLEL = 3


def unwritten(last: int, written: Iterable[tuple[int, int]], chunk: int) -> list[tuple[int, int]]:
    """The ``(after, upto]`` position ranges of 1..``last`` that no chunk in ``written`` (each
    a ``(first, last)`` pair) covers, cut into pieces of at most ``chunk`` positions."""
    if chunk < 1:
        raise CampaignError("a launch chunk holds at least 1 recipient")
    todo: list[tuple[int, int]] = []
    at = 0  # every position up to here is written or planned
    for first, upto in [*sorted(written), (last + 1, last + 1)]:
        gap_end = min(first - 1, last)
        while at < gap_end:
            todo.append((at, min(at + chunk, gap_end)))
            at = todo[-1][1]
        at = max(at, upto)
    return todo


def named(conn: Any, name: str) -> CampaignRow:
    """The campaign called ``name``; an error naming it when there is none."""
    campaign = campaigns_db.by_name(conn, name)
    if campaign is None:
        raise CampaignError(f"no campaign named {name!r}; create it first")
    return campaign


def finish_one(engine: Engine, campaign_id: int) -> bool:
    """``Campaigns.finish`` for one campaign: whether it was marked ``finished`` now."""
    with engine.begin() as conn:
        return bool(campaigns_db.finish(conn, campaign_id))


def launch_campaign(
    engine: Engine,
    name: str,
    progress: Callable[[int], None] = lambda n: None,
    chunk: int = CHUNK,
    parallel: int = PARALLEL,
    session: Engine | None = None,
) -> int:
    """``Campaigns.launch``: the notifications written by this run. The launch's lock is held
    on a connection of ``session`` (``engine`` when None): a session's advisory lock needs the
    same server connection from the lock to the unlock, which a transaction pooler does not
    keep (``NOTIFIER_DATABASE_SESSION_URL``)."""
    with engine.begin() as conn:
        campaign_id = named(conn, name).id
    with (session or engine).connect() as held:
        launches.lock_launch(held, campaign_id)
        held.commit()  # the lock is the session's: the connection waits outside a transaction
        try:
            written = _launch(engine, name, progress, chunk, parallel)
        finally:
            with contextlib.suppress(DBAPIError):  # a lost connection has let go of it
                launches.unlock_launch(held, campaign_id)
                held.commit()
    finish_one(engine, campaign_id)  # nothing to send (no audience, or nothing new): done now
    return written


def _launch(
    engine: Engine, name: str, progress: Callable[[int], None], chunk: int, parallel: int
) -> int:
    with engine.begin() as conn:
        campaign = named(conn, name)
        started = (
            CampaignStatus.draft,
            CampaignStatus.launching,
            CampaignStatus.running,
            CampaignStatus.finished,
        )
        if not campaigns_db.set_status(conn, campaign.id, CampaignStatus.launching, started):
            if campaign.status == CampaignStatus.cancelled:
                raise CampaignError(
                    f"campaign {name!r} was cancelled, which is final: it cannot launch"
                    " again (create a new campaign to send it)"
                )
            raise CampaignError(f"campaign {name!r} is {campaign.status}; it cannot launch")
        _check_ready(conn, campaign)
        last, due = launches.last_position(conn, campaign.id)
        fresh = not launches.has_rows(conn, campaign.id)
        todo = unwritten(last, launches.written_ranges(conn, campaign.id), chunk)
    if not todo:
        _launched(engine, campaign.id)
        return 0
    with engine.begin() as conn:
        launches.analyze(conn)
    rendered = render_sql(campaign.subject, campaign.body)
    payload = json.dumps({**campaign.payload, "campaign": campaign.name})

    def write(after: int, upto: int) -> int:
        with engine.begin() as conn:
            status = campaigns_db.hold_writes(conn, campaign.id, exclusive=False)
            if status == CampaignStatus.cancelled:
                raise CampaignError(
                    f"campaign {name!r} was cancelled while it launched; nothing more is"
                    " written, and every row written so far is cancelled"
                )
            when = None if status == CampaignStatus.paused else due
            n = launches.fan_out(conn, campaign, rendered, payload, when, after, upto, fresh)
            launches.record_chunk(conn, campaign.id, after, upto, n)
            return n

    written = 0
    pool = ThreadPoolExecutor(parallel, thread_name_prefix="notifier-launch")
    try:
        for done in as_completed([pool.submit(write, *r) for r in todo]):
            n = done.result()
            written += n
            progress(n)
    finally:
        # A chunk that failed stops the launch (re-run it to finish): nothing more starts.
        pool.shutdown(wait=True, cancel_futures=True)
    _launched(engine, campaign.id)
    return written


def _launched(engine: Engine, campaign_id: int) -> None:
    with engine.begin() as conn:
        campaigns_db.set_status(
            conn, campaign_id, CampaignStatus.running, [CampaignStatus.launching]
        )


def _check_ready(conn: Connection, campaign: CampaignRow) -> None:
    if campaign.template is None:
        names = set(placeholders(campaign.subject) + placeholders(campaign.body))
        fields = sorted(names - set(BUILT_IN))
    else:
        names = template_variables(conn, campaign.template, campaign.channel, campaign.locale)
        fields = sorted(names - TEMPLATE_BUILT_IN - set(campaign.payload))
    if fields:
        found = launches.recipient_missing(conn, campaign.id, fields)
        if found is not None:
            recipient, missing = found
            raise CampaignError(
                f"recipient {recipient!r} has no value for {', '.join(map(repr, missing))},"
                f" which the template uses (its fields: {', '.join(fields)});"
                " fix the audience and launch again"
            )
    if "code" in names:
        recipients, codes, given = campaigns_db.pool_counts(conn, campaign.id)
        need, spare = recipients - given, codes - given
        if need:
            raise CampaignError(
                f"{need} recipients still need a code but only {spare} codes are free;"
                f" import or generate at least {need - spare} more"
            )
