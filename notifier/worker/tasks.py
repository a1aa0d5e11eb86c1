"""notifier's Celery tasks, thin: the work is in ``notifier.delivery.dispatcher`` and
``notifier.ops``, the process's wiring in ``notifier.worker.runtime``.

``dispatch`` runs batches while a backlog remains. After each full batch it makes sure one more
``dispatch`` message waits in the queue (never more than one, thanks to a short-lived flag in
Redis), so idle worker processes and replicas join in until the backlog is gone, without a flood
of triggers.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import redis
from celery import signals

from notifier import db, health, ops, status_webhook
from notifier.campaigns import Campaigns
from notifier.db.rescue import rescue_expired
from notifier.settings import get_settings
from notifier.worker.app import app
from notifier.worker.heartbeat import MISSES
from notifier.worker.runtime import (
    dispatcher,
    redis_client,
    sigterm_stops_gracefully,
    stop_heartbeat,
)
from notifier.worker.wakeup import Waker

__all__ = ["app", "dispatch", "finish_campaigns", "purge", "rescue", "send_status_events"]

log = logging.getLogger(__name__)

#: Set while a follow-up dispatch waits in the queue; cleared when it starts.
WAITING_FLAG = "notifier:dispatch:waiting"


def _keep_one_waiting() -> None:
    """Make sure a dispatch waits in the queue; called for backlogs and wake-ups."""
    expires = get_settings().dispatch_interval
    if redis_client().set(WAITING_FLAG, 1, nx=True, ex=max(int(expires), 1)):
        dispatch.apply_async(expires=expires)


_waker: Waker | None = None


@signals.worker_ready.connect
def _start_waker(**_: Any) -> None:
    """Dispatch as soon as rows are inserted or fall due, not at the next beat; and at once,
    for rows that fell due while no worker ran (one dispatch waits however many replicas
    start together)."""
    global _waker
    settings = get_settings()
    if settings.wake_on_insert and _waker is None:
        _waker = Waker(db.engine(), settings.session_database_url, _keep_one_waiting)
        _waker.start()
    try:
        _keep_one_waiting()
    except redis.RedisError as exc:  # the broker is down too: the first beat after it does it
        log.warning("could not ask for a dispatch at start: %s", exc)


@signals.worker_ready.connect
def _configure_status_webhook(**_: Any) -> None:
    """Switch the trigger that writes status events to this worker's settings (off without
    ``NOTIFIER_STATUS_WEBHOOK_URL``); with a URL, every delivery tries again."""
    try:
        status_webhook.configure(db.engine(), get_settings())
    except Exception as exc:  # the lock was busy or the database away: not worth not starting
        log.warning("could not switch the status webhook's events: %s", exc)


@signals.worker_shutdown.connect
def _stop_waker(**_: Any) -> None:
    if _waker is not None:
        _waker.stop()
    stop_heartbeat()  # a worker whose tasks ran in its main process (solo, threads)


@app.task(name="notifier.dispatch")
def dispatch() -> int:
    """Send due notifications until none are left or the time budget is spent."""
    with contextlib.suppress(redis.RedisError):  # the flag expires by itself
        redis_client().delete(WAITING_FLAG)
    settings = get_settings()
    health.touch(settings.heartbeat_file)
    _rescue_now_and_then()
    with sigterm_stops_gracefully():
        reports = dispatcher().drain(on_full_batch=_between_full_batches)
    claimed = sum(r.claimed for r in reports)
    if claimed:
        with contextlib.suppress(redis.RedisError):
            redis_client().set(health.LAST_CLAIM_KEY, time.time())
    return claimed


@app.task(name="notifier.rescue")
def rescue() -> dict[str, int]:
    """Return rows whose worker died to ``pending`` (or ``dead``, if out of attempts)."""
    with db.engine().begin() as conn:
        counts = rescue_expired(conn)
    if any(counts.values()):
        log.warning("rescued rows with expired leases: %s", counts)
    return counts


@app.task(name="notifier.finish_campaigns")
def finish_campaigns() -> list[str]:
    """Mark ``finished`` the running campaigns whose every notification is final."""
    names = Campaigns(db.engine()).finish()
    for name in names:
        log.info("campaign %r finished: every notification is sent, dead or cancelled", name)
    return names


#: Set while a status webhook run is under way, until every request it made is recorded: one
#: at a time, so a receiver that hangs has one run's requests open at most.
STATUS_WEBHOOK_FLAG = "notifier:status_webhook:running"


@app.task(name="notifier.status_webhook")
def send_status_events() -> int:
    """POST the status webhook's due events (``notifier.status_webhook``), one run at a time.

    A run keeps this process for ``status_webhook.RUN_SECONDS`` (1 s) at most, on whatever
    queue and at whatever ``--concurrency``: requests the receiver has not answered by then
    finish on the process's event loop while it runs dispatches, and the flag is cleared once
    they are recorded. A run that stopped with events still due queues the next one at once."""
    settings = get_settings()
    longest = status_webhook.RUN_SECONDS + 3 * settings.webhook_timeout + 60  # a run that died
    if not redis_client().set(STATUS_WEBHOOK_FLAG, 1, nx=True, ex=int(longest)):
        return 0
    report = status_webhook.deliver(
        db.engine(), settings, budget_seconds=status_webhook.RUN_SECONDS, finished=_run_over
    )
    if report.more_due:  # behind the dispatches already queued: they wait 1 s at most
        send_status_events.apply_async(expires=status_webhook.BEAT_SECONDS)
    return report.sent


def _run_over() -> None:
    with contextlib.suppress(redis.RedisError):  # it expires by itself
        redis_client().delete(STATUS_WEBHOOK_FLAG)


@app.task(name="notifier.purge")
def purge(after: int = 0) -> dict[str, int]:
    """Delete finished rows past their retention (``notifier purge``), for one dispatch budget
    at a time: a fresh task carries on from where this one stopped."""
    settings = get_settings()
    budget = settings.dispatch_budget_seconds
    report = ops.purge(db.engine(), settings, budget_seconds=budget, after=after)
    if not report.finished:
        purge.apply_async(kwargs={"after": report.last_id}, expires=3600)
    return report.deleted


#: Set while some dispatch has run the rescue recently.
RESCUED_FLAG = "notifier:rescue:recent"


#: Seconds between two looks at ``RESCUED_FLAG`` from one process: between batches, the look
#: costs a round trip to Redis only this often, however short the batches.
RESCUE_LOOK_EVERY = 1.0
_next_rescue_look = 0.0


def _rescue_now_and_then() -> None:
    """Dispatches run the rescue too, at most every few seconds across the cluster, at their
    start and between the batches of a backlog: while a backlog keeps every pool process busy,
    beat's rescue messages wait in the queue, and a dead worker's rows with them. As often as a
    gone worker's grace, so its rows are not left waiting much longer than that."""
    global _next_rescue_look
    now = time.monotonic()
    if now < _next_rescue_look:
        return
    _next_rescue_look = now + RESCUE_LOOK_EVERY
    settings = get_settings()
    every = max(int(min(settings.dispatch_interval / 2, MISSES * settings.heartbeat_seconds)), 2)
    try:
        if not redis_client().set(RESCUED_FLAG, 1, nx=True, ex=every):
            return
    except redis.RedisError:
        return
    rescue()


def _between_full_batches() -> None:
    """A backlog remains: bring another worker in, and rescue if it is time to."""
    _keep_one_waiting()
    _rescue_now_and_then()
