"""The status webhook: every event of the outbox POSTed to the producers' URL until it lands.

Events are written by a trigger (migration 0015) in the very transaction that moved a row to a
final status or a delivery state, so none is lost and none is made up; this module only sends
them. ``deliver`` (the ``notifier.status_webhook`` task, fired by beat every few seconds):

* takes back events whose sender stopped before recording an answer (their lease ran out);
* claims up to ``BATCH_SIZE`` due events in one statement, oldest first, counting the attempt;
* POSTs them, **up to ``EVENTS_PER_POST`` events per request** (``{"events": [...]}``), every
  request of a batch at once on the process's event loop, outside any transaction, each within
  ``NOTIFIER_WEBHOOK_TIMEOUT`` to connect and for each read and three times that in all; a
  request the receiver hangs on holds back no other;
* records the answers in one transaction, each request's for all its events: 2xx ``sent``; a
  network error, a timeout, 408, 429 or 5xx ``pending`` again after the retry policy's backoff
  (honouring ``Retry-After``), or ``dead`` once ``NOTIFIER_STATUS_WEBHOOK_MAX_ATTEMPTS`` are
  spent; a redirect (never followed) or another 4xx ``dead`` at once. A dead event keeps why in
  ``last_error``.

**A run holds its worker process for about ``RUN_SECONDS`` (1 s) at most**, whatever the
receiver does: it claims no batch after that, and waits no longer for answers. Requests still
unanswered then go on without it on the process's event loop, within their own timeouts, and a
thread records their answers when they come; the task has returned, and the process runs
dispatches meanwhile. So a producer's slow or hanging receiver never holds a process that
dispatch needs, even at ``--concurrency=1`` with every task on the default queue. Not a
shorter HTTP timeout instead: a receiver that takes two seconds would then never be answered
in time, and not a queue and worker of its own: a deployment that did not start that worker
would never send an event.

Several events per request, because one POST per event cost a worker more than the send it
reports (a busy drain's rate halved); a receiver stores a request's events together or answers
an error for them all. Each event carries its own ``id`` the receiver deduplicates by: a retry
may group events differently, so the request's ``webhook-id`` names only the request. Requests
are signed like the ``webhook`` channel's (``notifier.signing``), with
``NOTIFIER_STATUS_WEBHOOK_SECRET``, and POSTed by the same ``notifier.providers.http.post``.
Delivery is at least once: an answer lost on the way, or a sender stopped between the POST and
its record, sends the events again under the same ids.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
import yarl
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from notifier import eventloop
from notifier.db import status_events as queries
from notifier.db.status_events import Counts, Event
from notifier.delivery.retry import RetryPolicy, next_attempt_at
from notifier.models import truncate
from notifier.providers.base import Outcome, Permanent, Retry, Sent
from notifier.providers.http import post
from notifier.settings import Settings
from notifier.signing import signing_key

log = logging.getLogger(__name__)

#: Events claimed per batch; its requests are POSTed at once.
BATCH_SIZE = 500
#: Events one request carries at most.
EVENTS_PER_POST = 100
#: Seconds between two beat-fired deliveries (``celeryconfig``).
BEAT_SECONDS = 5.0
#: Seconds a beat-fired run keeps its worker process at most: it claims no batch after that,
#: and leaves requests still unanswered then to finish on the event loop (see above).
RUN_SECONDS = 1.0
#: Added to the longest a batch's POSTs can take, for the lease of its claim.
LEASE_MARGIN_SECONDS = 60.0


@dataclass(slots=True)
class Report:
    claimed: int = 0
    sent: int = 0
    retried: int = 0
    dead: int = 0
    #: events whose request the run left to finish, and be recorded, after it returned
    answering: int = 0
    #: the run stopped at its budget while more events may be due
    more_due: bool = False


def wanted(settings: Settings) -> list[str]:
    """The states that make an event: ``NOTIFIER_STATUS_WEBHOOK_EVENTS``, none without a URL."""
    return settings.status_webhook_events if settings.status_webhook_url else []


def configure(engine: Engine, settings: Settings) -> bool:
    """Switch the trigger that writes events to what ``settings`` want (off without a URL);
    whether that changed it. Workers call it at start; it locks the table only to change it."""
    with engine.begin() as conn:
        changed = queries.configure(conn, wanted(settings))
    if changed:
        log.info("status webhook events: %s", ", ".join(wanted(settings)) or "off")
    return changed


def body(events: Sequence[Event]) -> bytes:
    """The JSON document POSTed for some events (docs/delivery-feedback.md)."""
    return json.dumps({"events": [_document(e) for e in events]}, separators=(",", ":")).encode()


def _document(event: Event) -> dict[str, Any]:
    return {
        "id": event_id(event.id),
        "type": f"notification.{event.kind}",
        "notification_id": event.notification_id,
        "dedupe_key": event.dedupe_key,
        "channel": event.channel,
        "state": event.state,
        "detail": event.detail,
        "at": event.occurred_at.isoformat(),
    }


def event_id(row_id: int) -> str:
    """An event's id: the same on every attempt, whichever request carries it."""
    return f"status-event-{row_id}"


def request_id(events: Sequence[Event]) -> str:
    """A request's ``webhook-id``: its first and last events'."""
    return f"status-events-{events[0].id}-{events[-1].id}"


def deliver(
    engine: Engine,
    settings: Settings,
    budget_seconds: float | None = None,
    per_post: int = EVENTS_PER_POST,
    finished: Callable[[], None] | None = None,
) -> Report:
    """Send due events, batch after batch, until none is due or ``budget_seconds`` is spent.

    With a budget the run returns once it is spent, even while a batch's requests are still
    waiting for their answers: those go on on the event loop and are recorded when they end
    (``Report.answering`` counts their events). While due notifications wait, one batch only:
    they go first, and the events they make follow once the backlog is gone. ``finished`` is
    called once every request of the run is recorded: before it returns, or later, from the
    thread that records the requests it left running."""
    report = Report()
    handed_off = False
    try:
        handed_off = _deliver(engine, settings, budget_seconds, per_post, finished, report)
    finally:
        if finished is not None and not handed_off:
            finished()
    return report


def _deliver(
    engine: Engine,
    settings: Settings,
    budget_seconds: float | None,
    per_post: int,
    finished: Callable[[], None] | None,
    report: Report,
) -> bool:
    """``deliver``'s work; whether it left a batch's requests running for a thread to record."""
    if not settings.status_webhook_url:
        return False
    try:
        url = _url(settings.status_webhook_url)
        key = (
            signing_key(settings.status_webhook_secret, "NOTIFIER_STATUS_WEBHOOK_SECRET")
            if settings.status_webhook_secret
            else None
        )
    except ValueError as exc:  # events wait, unsent, until the setting is fixed
        log.error("status webhook not sent: %s", exc)
        return False
    try:  # a worker whose start could not take the lock tries again
        configure(engine, settings)
    except DBAPIError as exc:  # the events already written go out all the same
        log.warning("could not switch the status webhook's events: %s", exc)
    limit = settings.webhook_timeout
    lease = 3 * limit + LEASE_MARGIN_SECONDS
    deadline = None if budget_seconds is None else time.monotonic() + budget_seconds
    with engine.begin() as conn:
        rescued = queries.rescue(conn, settings.status_webhook_max_attempts)
    if rescued:
        log.warning("status webhook: took back %d events whose sender stopped", rescued)
    with engine.connect() as conn:
        one_batch = budget_seconds is not None and queries.backlog(conn)
    while True:
        token = uuid.uuid4()
        with engine.begin() as conn:
            events = queries.claim(conn, token, BATCH_SIZE, lease)
        if not events:
            return False
        took = time.monotonic()
        answers = eventloop.submit(_post_all(url, key, events, limit, per_post))
        wait = None if deadline is None else max(deadline - took, 0.0)
        try:
            outcomes = answers.result(wait)
        except TimeoutError:  # the budget is spent: the answers are recorded when they come
            if not answers.done():  # else it ended just now: recorded here, as usual
                _record_later(answers, engine, settings, token, events, took, finished)
                report.answering += len(events)
                return True
            outcomes = answers.result()
        _add(report, _record(engine, settings, token, events, outcomes), took)
        if len(events) < BATCH_SIZE or one_batch:
            return False
        if deadline is not None and time.monotonic() >= deadline:
            report.more_due = True
            return False


def _record_later(
    answers: concurrent.futures.Future[list[Outcome]],
    engine: Engine,
    settings: Settings,
    token: uuid.UUID,
    events: Sequence[Event],
    took: float,
    finished: Callable[[], None] | None,
) -> None:
    """Once ``answers`` are in, record them from a thread of their own (never on the loop,
    which must not block on the database), then call ``finished``."""

    def record() -> None:
        try:
            if answers.cancelled():  # the process is stopping: the lease takes them back
                log.warning("status webhook: %d events left unanswered at exit", len(events))
            else:
                _add(Report(), _record(engine, settings, token, events, answers.result()), took)
        except Exception:  # the lease takes them back, and the next run sends them again
            log.exception("status webhook: could not record %d events' answers", len(events))
        finally:
            if finished is not None:
                finished()

    def started(_: object) -> None:
        threading.Thread(target=record, name="notifier-status-webhook", daemon=True).start()

    answers.add_done_callback(started)


def _add(report: Report, batch: Report, took: float) -> None:
    """Log one recorded batch, and count it into ``report``."""
    log.info(
        "status webhook claimed=%d sent=%d retried=%d dead=%d took=%.2fs",
        batch.claimed,
        batch.sent,
        batch.retried,
        batch.dead,
        time.monotonic() - took,
        extra={"event": "status_webhook", **_fields(batch)},
    )
    for name, value in _fields(batch).items():
        setattr(report, name, getattr(report, name) + value)


def counts(engine: Engine) -> Counts:
    """Pending, processing and dead events, and the oldest pending one's age."""
    with engine.connect() as conn:
        return queries.counts(conn)


def dead_events(engine: Engine, limit: int = 50) -> list[dict[str, object]]:
    """The latest dead events, newest first, each with ``last_error``: why it was given up."""
    with engine.connect() as conn:
        return queries.dead(conn, limit)


def requeue_dead(engine: Engine, ids: Sequence[int] | None = None) -> int:
    """Send dead events (these, or all) again from the first attempt; how many."""
    with engine.begin() as conn:
        return queries.requeue_dead(conn, ids)


async def _post_all(
    url: yarl.URL, key: bytes | None, events: Sequence[Event], limit: float, per_post: int
) -> list[Outcome]:
    """Each event's outcome: that of the request that carried it."""
    timeouts = aiohttp.ClientTimeout(
        total=3 * limit, connect=limit, sock_connect=limit, sock_read=limit
    )
    requests = [events[i : i + per_post] for i in range(0, len(events), per_post)]
    connector = aiohttp.TCPConnector(limit=len(requests))
    async with aiohttp.ClientSession(
        connector=connector,
        timeout=timeouts,
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,  # an answer is read raw and bounded, never decompressed
        trust_env=False,
    ) as session:
        answers = await asyncio.gather(
            *(post(session, url, request_id(r), body(r), key) for r in requests)
        )
    return [answer for r, answer in zip(requests, answers, strict=True) for _ in r]


def _record(
    engine: Engine,
    settings: Settings,
    token: uuid.UUID,
    events: Sequence[Event],
    outcomes: Sequence[Outcome],
) -> Report:
    """Write one batch's answers in one transaction."""
    policy = RetryPolicy(
        settings.retry_base_seconds, settings.retry_max_seconds, settings.retry_jitter
    )
    now = datetime.now(UTC)
    sent: list[int] = []
    retries: list[tuple[int, datetime, str]] = []
    dead: list[tuple[int, str]] = []
    for event, outcome in zip(events, outcomes, strict=True):
        if isinstance(outcome, Sent):
            sent.append(event.id)
        elif isinstance(outcome, Retry):
            at = next_attempt_at(
                policy,
                attempts=event.attempts,
                max_attempts=settings.status_webhook_max_attempts,
                now=now,
                retry_after=outcome.retry_after,
            )
            if at is None:
                reason = f"gave up after {event.attempts} attempts; last error: {outcome.error}"
                dead.append((event.id, truncate(reason)))
            else:
                retries.append((event.id, at, truncate(outcome.error)))
        else:
            assert isinstance(outcome, Permanent)
            dead.append((event.id, truncate(outcome.error)))
    with engine.begin() as conn:
        queries.mark_sent(conn, token, sent)
        queries.schedule_retry(conn, token, retries)
        queries.mark_dead(conn, token, dead)
    return Report(len(events), len(sent), len(retries), len(dead))


def _fields(report: Report) -> dict[str, int]:
    return {
        "claimed": report.claimed,
        "sent": report.sent,
        "retried": report.retried,
        "dead": report.dead,
    }


def _url(value: str) -> yarl.URL:
    try:
        url = yarl.URL(value)
    except ValueError as exc:
        raise ValueError(f"NOTIFIER_STATUS_WEBHOOK_URL is malformed: {exc}") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError("NOTIFIER_STATUS_WEBHOOK_URL must be an absolute http(s) URL")
    return url
