"""The process's engine, and the psycopg connection under a SQLAlchemy one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

import psycopg
from psycopg.abc import AdaptContext, Buffer
from psycopg.adapt import Loader
from psycopg.types.datetime import TimestamptzLoader
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from notifier.settings import get_settings

#: Connections an engine keeps open, and how many more it may open when they are all busy: the
#: most one process's engine holds (counted in ``notifier.worker.budget``).
POOL_SIZE, POOL_OVERFLOW = 2, 2


@lru_cache(maxsize=1)
def engine() -> Engine:
    """The process's engine, created on first use (after a prefork worker has forked)."""
    return make_engine(get_settings().database_url, ping=_pinging)


#: Whether this process's engine pings a connection before handing it out (``without_ping``).
_pinging = True


def without_ping() -> None:
    """From now on, this process's engine hands its connections out without a ping: for a
    worker process, whose statements on the hot path run again when their connection turns
    out dead (``notifier.delivery.durable``), and to which a ping is one more round trip per
    statement. A process that answers people (the console, the events endpoint) keeps it."""
    global _pinging
    _pinging = False
    dispose_engine()


#: Seconds a connection attempt may take, unless the URL's ``connect_timeout`` says otherwise.
CONNECT_TIMEOUT = 10


def make_engine(
    url: str,
    *,
    ping: bool = True,
    pool_size: int = POOL_SIZE,
    overflow: int = POOL_OVERFLOW,
    statement_timeout: float | None = None,
) -> Engine:
    """An engine whose connections read any timestamp a producer can write; with ``ping``,
    each connection is pinged before it is handed out, and replaced if it is dead. It holds
    at most ``pool_size`` + ``overflow`` connections; with ``statement_timeout`` (seconds)
    PostgreSQL cancels any of its statements that runs longer."""
    connect_args: dict[str, Any] = {"application_name": "notifier"}
    if statement_timeout is not None:
        connect_args["options"] = f"-c statement_timeout={round(statement_timeout * 1000)}"
    if "connect_timeout" not in make_url(url).query:  # connect_args would override the URL's
        connect_args["connect_timeout"] = CONNECT_TIMEOUT
    eng = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=overflow,
        pool_pre_ping=ping,  # a connection killed by a database restart is replaced, not used
        pool_recycle=1800,
        connect_args=connect_args,
    )
    event.listen(eng, "connect", _on_connect)
    return eng


def dispose_engine(*, close: bool = False) -> None:
    """Forget the process's engine; right after fork, without closing the parent's sockets."""
    if engine.cache_info().currsize:
        engine().dispose(close=close)
    engine.cache_clear()


def driver(conn: Connection) -> psycopg.Connection[Any]:
    """The psycopg connection under ``conn``, for COPY and for results read without a layer
    between; it is inside ``conn``'s transaction."""
    raw = conn.connection.driver_connection
    if not isinstance(raw, psycopg.Connection):
        raise TypeError("notifier needs the psycopg 3 driver (postgresql+psycopg://)")
    return raw


@contextmanager
def driver_errors(conn: Connection) -> Iterator[None]:
    """psycopg's errors from statements sent through ``driver(conn)``, raised as SQLAlchemy
    raises a driver's (``OperationalError`` for a lost connection, ``IntegrityError`` and the
    like for the data), so that callers retry, split or refuse them as any statement's."""
    try:
        yield
    except psycopg.Error as exc:
        raw = conn.connection.driver_connection
        lost = not isinstance(raw, psycopg.Connection) or raw.closed or raw.broken
        if lost:
            conn.invalidate()
        raise DBAPIError.instance(
            None, None, exc, psycopg.Error, connection_invalidated=lost, dialect=conn.dialect
        ) from exc


#: The loader psycopg reads ``timestamptz`` text with by default: its C one where the binary
#: package is installed, about six times quicker than the pure-Python class.
_TIMESTAMPTZ_OID = psycopg.adapters.types["timestamptz"].oid
_DefaultTimestamptz = psycopg.adapters.get_loader(_TIMESTAMPTZ_OID, psycopg.pq.Format.TEXT)


class _SafeTimestamptz(Loader):
    """Reads ``infinity``, ``-infinity`` and years past 9999 as the latest and earliest times
    Python has, instead of failing the statement: a producer may write ``'infinity'`` into
    ``expires_at`` to mean "never", and one such row must not stop every claim.

    Every other value goes through psycopg's default loader (wrapped, not subclassed: the C
    class's fast path would skip an override)."""

    def __init__(self, oid: int, context: AdaptContext | None = None) -> None:
        super().__init__(oid, context)
        loader = _DefaultTimestamptz or TimestamptzLoader
        self._load = loader(oid, context).load

    def load(self, data: Buffer) -> datetime:
        try:
            value: datetime = self._load(data)
        except psycopg.DataError:
            text_ = bytes(data).decode(errors="replace")
            early = text_.startswith("-") or text_.endswith(" BC")
            return (datetime.min if early else datetime.max).replace(tzinfo=UTC)
        return value


def _on_connect(dbapi_connection: Any, _record: Any) -> None:
    if isinstance(dbapi_connection, psycopg.Connection):
        dbapi_connection.adapters.register_loader("timestamptz", _SafeTimestamptz)
