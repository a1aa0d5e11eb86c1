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
    settings = get_settings()
    return make_engine(settings.database_url, ping=_pinging, pooled=settings.transaction_pooled)


@lru_cache(maxsize=1)
def session_engine() -> Engine:
    """The engine for what holds a server connection across transactions (a campaign launch's
    advisory lock): on ``NOTIFIER_DATABASE_SESSION_URL``, which bypasses a transaction pooler;
    the process's engine itself when that is unset. One connection, and one more if busy."""
    settings = get_settings()
    if settings.database_session_url is None:
        return engine()
    return make_engine(settings.database_session_url, pool_size=1, overflow=1)


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
    pooled: bool = False,
) -> Engine:
    """An engine whose connections read any timestamp a producer can write; with ``ping``,
    each connection is pinged before it is handed out, and replaced if it is dead. It holds
    at most ``pool_size`` + ``overflow`` connections; with ``statement_timeout`` (seconds)
    PostgreSQL cancels any of its statements that runs longer.

    ``pooled``: ``url`` reaches a pooler in transaction mode (``NOTIFIER_DATABASE_POOLER``),
    where each transaction may run on another server connection. psycopg then prepares no
    statement: it would prepare one on the server connection of its fifth run, and a later
    run would find it missing ("prepared statement does not exist") or another client's
    there ("already exists"). The statement timeout is set in each transaction instead of at
    login, as PgBouncer refuses the ``options`` a login would carry it in."""
    connect_args: dict[str, Any] = {"application_name": "notifier"}
    if pooled:
        connect_args["prepare_threshold"] = None
    elif statement_timeout is not None:
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
    if pooled and statement_timeout is not None:
        event.listen(eng, "begin", _TimeoutEachTransaction(round(statement_timeout * 1000)))
    return eng


class _TimeoutEachTransaction:
    """Sets ``statement_timeout`` for the transaction about to begin (``SET LOCAL``: it ends
    with the transaction, never reaching the next client of the same server connection)."""

    def __init__(self, milliseconds: int) -> None:
        self.statement = f"SET LOCAL statement_timeout = {milliseconds}"

    def __call__(self, conn: Connection) -> None:
        raw = driver(conn)
        if not raw.autocommit:  # outside a transaction SET LOCAL does nothing
            raw.execute(self.statement)


def own_connection(url: str, *, application_name: str) -> psycopg.Connection[Any]:
    """A connection in autocommit outside any engine's pool, to the database ``url`` names: for
    a heartbeat or a ``LISTEN`` that a busy pool must not delay.

    The URL is read the way the engine reads it, so that both reach the same server: several
    hosts (``?host=h1:p1&host=h2:p2``, with ``target_session_attrs=read-write`` to take the one
    primary among them) become libpq's ``host=h1,h2 port=p1,p2``. Handed to libpq as written,
    that URL would name its last host only, with the port taken for part of the host's name."""
    parsed = make_url(url)
    _, params = parsed.get_dialect()().create_connect_args(parsed)
    params.setdefault("connect_timeout", CONNECT_TIMEOUT)
    params["application_name"] = application_name
    # Its statements run every few seconds: preparing them saves nothing, and behind a
    # transaction pooler a prepared statement's next run may land on another server connection.
    return psycopg.connect(autocommit=True, prepare_threshold=None, **params)


def dispose_engine(*, close: bool = False) -> None:
    """Forget the process's engine; right after fork, without closing the parent's sockets."""
    if session_engine.cache_info().currsize:  # perhaps the process's engine: disposed twice
        session_engine().dispose(close=close)
    session_engine.cache_clear()
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
