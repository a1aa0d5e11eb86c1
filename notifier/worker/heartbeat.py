"""A worker process's heartbeat: proof, renewed from a thread of its own, that it still lives.

The rescue takes back the rows of a worker whose heartbeat lapsed (``notifier.db.workers.GONE``),
so a killed worker's rows return within seconds instead of at the end of their lease. A worker that
is alive but slow keeps its rows: the beat runs beside the batch, on its own connection, and a
send that waits on the network holds neither the GIL nor a database connection.

``MISSES`` beats may be missed before the worker counts as gone. Each beat states that grace
itself, so workers with different ``NOTIFIER_HEARTBEAT_SECONDS`` are judged each by its own.
"""

from __future__ import annotations

import contextlib
import logging
import threading

from notifier.db import workers

log = logging.getLogger(__name__)

#: Beats a worker may miss before it counts as gone.
MISSES = 3


class Heartbeat(threading.Thread):
    """Renews ``name``'s row in ``workers`` every ``interval`` seconds until ``stop()``."""

    def __init__(self, database_url: str, name: str, interval: float) -> None:
        super().__init__(name="notifier-heartbeat", daemon=True)
        self.database_url = database_url
        self.worker = name
        self.interval = interval
        self._stopped = threading.Event()
        self._conn: workers.BeatConnection | None = None

    @property
    def grace(self) -> float:
        return MISSES * self.interval

    def beat(self) -> bool:
        """Renew now; False (and the connection dropped, to be made again) if that failed."""
        try:
            if self._conn is None or self._conn.closed:
                self._conn = workers.connect(self.database_url)
            workers.beat(self._conn, self.worker, self.grace)
            return True
        except workers.DriverError as exc:
            log.warning("heartbeat of %s failed (%s); trying again", self.worker, exc)
            self._close()
            return False

    def run(self) -> None:
        while not self._stopped.is_set():
            # After a failure, try again soon: the grace is only a few beats long.
            wait = self.interval if self.beat() else min(1.0, self.interval)
            self._stopped.wait(wait)

    def stop(self) -> None:
        """Stop beating and say this worker is gone, so what it still holds is rescued soon."""
        self._stopped.set()
        if self.is_alive():
            self.join(timeout=self.interval + 15)
            if self.is_alive():  # stuck in a beat: its lapse will say the same, a little later
                return
        try:
            if self._conn is None or self._conn.closed:
                self._conn = workers.connect(self.database_url)
            workers.retire(self._conn, self.worker)
        except workers.DriverError as exc:  # then its heartbeat lapses by itself
            log.warning("could not retire worker %s: %s", self.worker, exc)
        self._close()

    def _close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(workers.DriverError):
                self._conn.close()
            self._conn = None
