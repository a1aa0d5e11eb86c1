"""Sub-second delivery: wake the dispatcher when rows are inserted or fall due.

Every INSERT of pending rows fires ``NOTIFY notifier_wake, '<earliest due time>'`` on commit (a
statement-level trigger; see migration 0002). A ``Waker`` thread in each worker LISTENs: a row
due now triggers a dispatch at once; a delayed one is remembered and triggers a dispatch when
its time comes.

This is only an accelerator. The remembered times live in memory and are lost with the process;
a missed or dropped wake-up costs latency, never a row: beat's dispatch every
``NOTIFIER_DISPATCH_INTERVAL`` seconds is the safety net, and on (re)connecting the waker reads
the earliest delayed row from the table again.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy import Engine

from notifier.db import wakeups

log = logging.getLogger(__name__)

#: Remember at most this many future wake-up times; later ones are found by the re-read.
MAX_TIMERS = 10_000
#: Re-read the earliest delayed row this often, to cover updates that fire no trigger.
RESYNC_SECONDS = 60.0


class Waker(threading.Thread):
    """Calls ``wake()`` whenever pending rows are or become due. Stops with ``stop()``.

    It LISTENs on ``database_url``, which must keep one server connection for it: PostgreSQL
    itself or a session-mode pool (``NOTIFIER_DATABASE_SESSION_URL``), never a transaction
    pooler, which gives the server connection that LISTENed to other clients as soon as the
    statement is done: the wake-ups would reach them, or nobody. Its re-reads use ``engine``."""

    def __init__(self, engine: Engine, database_url: str, wake: Callable[[], None]) -> None:
        super().__init__(name="notifier-waker", daemon=True)
        self._engine = engine
        self._url = database_url
        self._wake = wake
        self._timers: list[float] = []
        self._stopped = threading.Event()

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> None:
        backoff = 1.0
        while not self._stopped.is_set():
            try:
                self._listen()
                backoff = 1.0
            except Exception as exc:  # the database went away, or a bug: retry, never die
                log.warning("wake-up listener failed (%s); again in %.0fs", exc, backoff)
                self._stopped.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _listen(self) -> None:
        with wakeups.listen(self._url) as conn:
            self._resync()
            resync_at = time.monotonic() + RESYNC_SECONDS
            while not self._stopped.is_set():
                now = time.time()
                if self._timers and self._timers[0] <= now:
                    while self._timers and self._timers[0] <= now:
                        heapq.heappop(self._timers)
                    self._fire()
                    self._resync()  # one insert names only its earliest row: find the next
                timeout = 1.0 if not self._timers else min(max(self._timers[0] - now, 0.0), 1.0)
                for notify in conn.notifies(timeout=timeout, stop_after=1):
                    self._remember(notify.payload)
                if time.monotonic() >= resync_at:
                    self._resync()
                    resync_at = time.monotonic() + RESYNC_SECONDS

    def _remember(self, payload: str) -> None:
        try:
            due = float(payload)
        except ValueError:
            due = 0.0  # unreadable: treat as due now
        if due <= time.time():
            self._fire()
        elif len(self._timers) < MAX_TIMERS:
            heapq.heappush(self._timers, due)

    def _resync(self) -> None:
        with self._engine.connect() as conn:
            due = wakeups.next_wake(conn)
        if due is not None and (not self._timers or due < self._timers[0]):
            heapq.heappush(self._timers, due)

    def _fire(self) -> None:
        try:
            self._wake()
        except Exception:  # a failed wake-up is only a later send; beat will catch up
            log.exception("waking the dispatcher failed")
