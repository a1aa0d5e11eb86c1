"""A transaction in one round trip: its statements sent together, their answers read after.

With PostgreSQL a network hop away, what a batch costs is its round trips, not its statements:
a transaction sent the usual way waits for the pool's ping, for ``BEGIN``, for each statement
and for ``COMMIT``. ``one_trip`` sends ``BEGIN``, the statements the block executes and
``COMMIT`` in one flight (psycopg's pipeline mode, on a connection in autocommit so that
psycopg adds no ``BEGIN`` of its own) and reads every answer when the block ends: cursors
executed in the block are read after it.

The statements are one transaction: one the database refuses rolls all of them back, and the
error is raised as SQLAlchemy raises a driver's (``OperationalError`` for a lost connection,
``IntegrityError`` and the like for the data), so callers retry or split as they would any
statement. A connection that failed inside a trip is discarded with whatever state it was left
in (a transaction the server aborted, a broken socket), never handed out again; when it was
lost, the pool's other connections are replaced too, as SQLAlchemy does on a disconnect.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from sqlalchemy import Engine

from notifier.db.engine import driver, driver_errors

#: The connection statements are queued on inside ``one_trip``.
Trip = psycopg.Connection[Any]


@contextmanager
def one_trip(engine: Engine) -> Iterator[Trip]:
    """A transaction whose statements travel together; read their cursors after the block."""
    with engine.connect() as conn:
        raw = driver(conn)
        try:
            with driver_errors(conn):
                try:
                    # The BEGIN below is the transaction's, sent with the rest.
                    raw.autocommit = True
                    with raw.pipeline():
                        raw.execute("BEGIN")
                        yield raw
                        raw.execute("COMMIT")
                    raw.autocommit = False
                except psycopg.Error:
                    if raw.closed or raw.broken:  # the server went away: so did the pool's others
                        engine.dispose()
                    raise
        except BaseException:
            conn.invalidate()  # whatever state the trip left it in, it is not handed out again
            raise
