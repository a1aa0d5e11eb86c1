"""A worker process's wiring: its dispatcher, Redis client and heartbeat, made once per
process, and the Celery signals that set them up, check the settings at start, and close them
at the end. The tasks (``notifier.worker.tasks``) only call into it.

Stopping: on a warm shutdown (SIGTERM to the worker) the main process passes SIGTERM on to its
pool processes, where it sets ``STOPPING``: the dispatch under way claims nothing more, lets the
sends in progress finish and hands its unstarted rows back at once.

Failing closed: before each claim and each batch's sends the dispatcher pings Redis
(``redis_gate``); if Redis cannot be reached (under Sentinel: while no primary is named, during
a failover) nothing is sent and claimed rows go back to ``pending`` without using up an attempt.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import threading
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import billiard.process
import redis
from celery import signals

from notifier import db, eventloop, logs, metrics, redis_access
from notifier.db import workers
from notifier.delivery import guards
from notifier.delivery.caps import FrequencyCaps
from notifier.delivery.dispatcher import Dispatcher, SendingPaused
from notifier.delivery.ratelimit import RateLimiter
from notifier.models import Decision
from notifier.providers import chains, load_registry
from notifier.settings import get_settings
from notifier.worker import budget
from notifier.worker.app import app
from notifier.worker.heartbeat import Heartbeat

log = logging.getLogger(__name__)
# httpx logs every request's full URL at INFO; webhook URLs often carry secrets.
logging.getLogger("httpx").setLevel(logging.WARNING)

#: Set in a pool process once its worker is shutting down.
STOPPING = threading.Event()


@lru_cache(maxsize=1)
def dispatcher() -> Dispatcher:
    dispatcher = Dispatcher(
        db.engine(),
        load_registry(get_settings()),
        get_settings(),
        gate=redis_gate,
        stopping=STOPPING,
        guards=guards.load_registry(get_settings()),
        limiter=RateLimiter(redis_client(), get_settings().rate_limits, get_settings().rate_warmup),
        observe=count,
        caps=FrequencyCaps(redis_client(), get_settings().frequency_caps),
    )
    _start_heartbeat(dispatcher.worker)
    return dispatcher


#: This process's heartbeat, once it has a dispatcher (and so a name to claim rows under).
_heartbeat: Heartbeat | None = None


def _start_heartbeat(name: str) -> None:
    global _heartbeat
    settings = get_settings()
    _heartbeat = Heartbeat(settings.database_url, name, settings.heartbeat_seconds)
    _heartbeat.beat()  # registered before the first claim, if the database lets it
    _heartbeat.start()


def stop_heartbeat() -> None:
    global _heartbeat
    if _heartbeat is not None:
        _heartbeat.stop()
        _heartbeat = None


def count(attempts: list[Decision]) -> None:
    try:
        metrics.record(redis_client(), attempts, _labels())
    except redis.RedisError as exc:  # metrics are worth less than the sends they describe
        log.warning("could not update metrics: %s", exc)


@lru_cache(maxsize=1)
def _labels() -> metrics.Labels:
    return metrics.Labels.of(dispatcher().registry)


def redis_gate() -> None:
    try:
        redis_client().ping()
    except redis.RedisError as exc:
        raise SendingPaused(f"Redis unreachable ({exc}); not sending until it is back") from exc


@lru_cache(maxsize=1)
def redis_client() -> redis.Redis:
    """This process's client of the current Redis primary (one server, or Sentinel's pick)."""
    return redis_access.client(get_settings(), timeout=5)


@signals.worker_ready.connect
def _report_unconfigured(**_: Any) -> None:
    """Say at start which channels cannot send here, rather than only in each row's error."""
    settings = get_settings()
    registry = load_registry(settings)
    try:  # only the providers that serve a channel: an email API nobody chose is no problem
        serving = {id(p) for chain in chains(registry, settings.failover).values() for p in chain}
    except ValueError as exc:
        log.warning("no channel can send: %s", exc)
        return
    for provider in registry.values():
        problem = provider.problem() if id(provider) in serving else None
        if problem is not None:
            log.warning("channel %s cannot send: %s", provider.channel, problem)


@contextlib.contextmanager
def sigterm_stops_gracefully() -> Iterator[None]:
    """While a dispatch runs in a pool process, SIGTERM asks it to stop instead of killing it.

    Billiard installs its own SIGTERM handler in pool processes after start-up, so ours is put
    in place for the length of the task only, and the previous one restored after it.
    """
    STOPPING.clear()
    if threading.current_thread() is not threading.main_thread():  # a thread pool: no signals
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda *_: STOPPING.set())
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@signals.after_setup_logger.connect
@signals.after_setup_task_logger.connect
def _configure_logging(logger: logging.Logger, **_: Any) -> None:
    """NOTIFIER_LOG_FORMAT and recipient masking for the handlers Celery has just set up."""
    logs.configure(get_settings(), logger)


@signals.celeryd_after_setup.connect
def _check_connection_budget(instance: Any, **_: Any) -> None:
    """Refuse to start when the expected workers could open more database connections than
    PostgreSQL allows (behind a transaction pooler: than the pooler and PostgreSQL allow);
    warn when close. Once the pool's size is known, before it starts."""
    settings = get_settings()
    prefork = "prefork" in getattr(instance.pool_cls, "__module__", "")
    wanted = budget.Budget(
        concurrency=int(instance.concurrency) if prefork else 1,
        replicas=settings.expected_workers,
        wake_on_insert=settings.wake_on_insert,
    )
    try:
        with db.engine().connect() as conn:
            limits = workers.connection_limits(conn)
    except Exception as exc:  # the database is not there yet: the worker waits for it
        log.warning("could not check PostgreSQL's connection limit: %s", exc)
        return
    if settings.transaction_pooled:
        pooler = budget.read_pooler(settings.database_url)
        found = budget.pooled_verdict(wanted, pooler, limits)
    else:
        found = budget.verdict(wanted, limits)
    if found is None:
        return
    level, line = found
    if level == "warn":
        log.warning("%s", line)
        return
    log.critical("%s", line)
    raise SystemExit(1)


@signals.worker_init.connect
def _check_settings(**_: Any) -> None:
    settings = get_settings()
    if settings.lease_seconds <= app.conf.task_time_limit:
        log.warning(
            "NOTIFIER_LEASE_SECONDS=%s is not above the task time limit (%ss): a slow batch may "
            "be rescued while it is still sending, and some rows sent twice",
            settings.lease_seconds,
            app.conf.task_time_limit,
        )


@signals.worker_process_init.connect
def _after_fork(**_: Any) -> None:
    """A forked worker process must not share its parent's database or Redis sockets."""
    global _heartbeat
    _heartbeat = None  # the parent's, if it had one, did not survive the fork
    db.without_ping()  # and forgets the parent's engine
    dispatcher.cache_clear()
    redis_client.cache_clear()
    try:  # load the providers now, not in the first dispatch (whose sends it would delay)
        dispatcher()
    except Exception:  # a broken plugin or setting shows in the first dispatch too
        log.exception("could not prepare the dispatcher")
    _tune_garbage_collector()


#: Allocations between two collections of the youngest generation (Python's default: 700).
YOUNG_COLLECTION_THRESHOLD = 10_000


def _tune_garbage_collector() -> None:
    """Freeze what start-up made, and collect young objects less often.

    A pool process holds a large heap that lives as long as it does (Celery, SQLAlchemy, the
    providers), and every full collection walks all of it: with Python's defaults a busy worker
    ran one about every second, and collections took a fifth of its CPU in a webhook drain.
    Frozen objects are never walked again; a higher first threshold makes rarer the young
    collections that each batch of sends triggers by the hundred. Reference cycles are still
    collected, only less often.
    """
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, middle, oldest)


@signals.worker_process_shutdown.connect
def _close_before_exit(**_: Any) -> None:
    """A pool process about to exit closes its keep-alive connections (receivers see a clean
    close, not a reset) and stops its event loop."""
    try:
        if dispatcher.cache_info().currsize:
            dispatcher().close()
        eventloop.stop()
        stop_heartbeat()
    except Exception:  # exiting anyway: the kernel closes what is left
        log.exception("could not close the dispatcher cleanly")


@signals.worker_shutting_down.connect
def _tell_pool_processes(**_: Any) -> None:
    """Warm shutdown: let each pool process stop claiming and hand back what it has not sent."""
    for child in billiard.process.active_children():
        if child.pid:
            with contextlib.suppress(ProcessLookupError):  # it has just exited
                os.kill(child.pid, signal.SIGTERM)
