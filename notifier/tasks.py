"""The Celery app and its thin tasks. All the work is in ``notifier.dispatch``.

``dispatch`` runs batches while a backlog remains. After each full batch it makes sure one more
``dispatch`` message waits in the queue (never more than one, thanks to a short-lived flag in
Redis), so idle worker processes and replicas join in until the backlog is gone, without a flood
of triggers.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any

import redis
from celery import Celery, signals

from notifier import store
from notifier.dispatch import Dispatcher
from notifier.providers import load_registry
from notifier.settings import get_settings

log = logging.getLogger(__name__)

app = Celery("notifier")
app.config_from_object("celeryconfig")

#: Set while a follow-up dispatch waits in the queue; cleared when it starts.
WAITING_FLAG = "notifier:dispatch:waiting"


@lru_cache(maxsize=1)
def _dispatcher() -> Dispatcher:
    return Dispatcher(store.engine(), load_registry(), get_settings())


@lru_cache(maxsize=1)
def _redis() -> redis.Redis:
    return redis.Redis.from_url(
        get_settings().redis_url, socket_timeout=5, socket_connect_timeout=5
    )


def _keep_one_waiting() -> None:
    expires = get_settings().dispatch_interval
    if _redis().set(WAITING_FLAG, 1, nx=True, ex=max(int(expires), 1)):
        dispatch.apply_async(expires=expires)


@app.task(name="notifier.dispatch")
def dispatch() -> int:
    """Send due notifications until none are left or the time budget is spent."""
    _redis().delete(WAITING_FLAG)
    return sum(r.claimed for r in _dispatcher().drain(on_full_batch=_keep_one_waiting))


@app.task(name="notifier.rescue")
def rescue() -> dict[str, int]:
    """Return rows whose worker died to ``pending`` (or ``dead``, if out of attempts)."""
    with store.engine().begin() as conn:
        counts = store.rescue_expired(conn)
    if any(counts.values()):
        log.warning("rescued rows with expired leases: %s", counts)
    return counts


@signals.worker_process_init.connect
def _after_fork(**_: Any) -> None:
    """A forked worker process must not share its parent's database or Redis sockets."""
    store.dispose_engine()
    _dispatcher.cache_clear()
    _redis.cache_clear()
