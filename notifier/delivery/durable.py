"""Steps that must survive a lost connection: run again until they are done.

A worker that sent a batch must not forget it because PostgreSQL restarted or a connection
broke; nor may it give up a look before sending for the same reason. ``until_done`` runs one
step (a transaction sent in one round trip, ``notifier.db.trips``, or statements in autocommit,
``each_until_done``) and, when the database goes away (``OperationalError``,
``InterfaceError``), runs it again after a growing pause, until it is done or ``within``
seconds are spent: the claim's lease, after which the rescue owns the rows anyway. An error the
database raises for the data is not retried: it would be raised again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import InterfaceError, OperationalError

log = logging.getLogger(__name__)
T = TypeVar("T")


def each_until_done(engine: Engine, statements: Callable[[Connection], T], *, within: float) -> T:
    """``statements``, each its own transaction (autocommit: no ``BEGIN`` or ``COMMIT`` to wait
    for), run again while the database is away (``until_done``). For reads, and for writes of
    one statement."""

    def autocommitted() -> T:
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT")
            return statements(conn)

    return until_done(autocommitted, within=within)


def until_done(work: Callable[[], T], *, within: float) -> T:
    """``work``, run again while the database is away, for at most ``within`` seconds."""
    deadline = time.monotonic() + within
    delay = 0.1
    while True:
        try:
            return work()
        except (OperationalError, InterfaceError) as exc:  # connection lost, db restarting
            if time.monotonic() + delay >= deadline:
                raise
            log.warning("database write failed (%s); retrying in %.1fs", exc, delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
