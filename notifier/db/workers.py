"""The SQL of worker liveness and of the connection budget: the ``workers`` table, and what
PostgreSQL says about its connection limit.

Each worker process that claims rows keeps one row in ``workers`` under the name it writes into
``notifications.claimed_by``. Its heartbeat renews ``last_seen`` and ``alive_until`` (how long
that renewal vouches for it). A worker is **gone** once ``alive_until`` has passed, counted
from the later of its last renewal and the database server's start: a database restart makes
every heartbeat miss a few beats, and must not make every live worker look dead. A name with no
row (a worker of an older release) is never gone; its rows wait for their lease.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from sqlalchemy import Connection, text

from notifier.db.engine import own_connection
from notifier.db.sql import for_driver

#: A SQL condition on ``workers AS w``: that worker process is gone (see the module docstring).
#: NULL, never true, when ``w`` is the missing side of an outer join.
GONE = """(w.alive_until < now()
           AND greatest(w.last_seen, pg_postmaster_start_time())
               + (w.alive_until - w.last_seen) < now())"""

# Run on the heartbeat's own autocommit connection; the first run writes ``started_at``.
BEAT = for_driver(
    """
    INSERT INTO workers AS w (name, started_at, last_seen, alive_until)
    VALUES (:name, now(), now(), now() + make_interval(secs => :grace))
    ON CONFLICT (name) DO UPDATE
       SET last_seen = now(), alive_until = excluded.alive_until
"""
)

RETIRE = for_driver("UPDATE workers SET last_seen = now(), alive_until = now() WHERE name = :name")

#: Rows of workers gone this long ago are forgotten (their rows were rescued long since).
FORGET_AFTER = "1 day"

FORGET_GONE = text(f"DELETE FROM workers WHERE alive_until < now() - interval '{FORGET_AFTER}'")

HELD_BY_GONE = text(
    f"""
    SELECT w.name, count(*), extract(epoch FROM now() - w.last_seen)::float8
      FROM notifications n JOIN workers w ON w.name = n.claimed_by
     WHERE n.status = 'processing' AND n.locked_until IS NOT NULL AND {GONE}
     GROUP BY w.name, w.last_seen
     ORDER BY count(*) DESC, w.name
    """
)

CONNECTION_LIMITS = text(
    """
    SELECT current_setting('max_connections')::int,
           current_setting('superuser_reserved_connections')::int,
           coalesce(current_setting('reserved_connections', true), '0')::int,
           (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int
    """
)


#: What the driver raises when the heartbeat's connection fails.
DriverError = psycopg.Error

#: The heartbeat's connection of its own (``connect``).
BeatConnection = psycopg.Connection[Any]


def connect(database_url: str) -> psycopg.Connection[Any]:
    """The heartbeat's connection of its own: a busy engine pool cannot delay a beat."""
    return own_connection(database_url, application_name="notifier-heartbeat")


def beat(conn: psycopg.Connection[Any], name: str, grace_seconds: float) -> None:
    """This worker is alive, and vouches for itself for ``grace_seconds`` more."""
    conn.execute(BEAT, {"name": name, "grace": grace_seconds})


def retire(conn: psycopg.Connection[Any], name: str) -> None:
    """This worker is stopping: gone from now on, so any row it still holds is rescued soon."""
    conn.execute(RETIRE, {"name": name})


def forget_gone(conn: Connection) -> int:
    """Delete the rows of workers gone for over a day."""
    return int(conn.execute(FORGET_GONE).rowcount)


@dataclass(frozen=True, slots=True)
class GoneWorker:
    name: str
    rows: int
    #: seconds since its last heartbeat
    silent_seconds: float


def held_by_gone(conn: Connection) -> list[GoneWorker]:
    """Workers that are gone yet still hold ``processing`` rows, most rows first."""
    return [
        GoneWorker(str(name), int(rows), float(silent))
        for name, rows, silent in conn.execute(HELD_BY_GONE).all()
    ]


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_connections: int
    #: slots only superusers (and, from PostgreSQL 16, ``pg_use_reserved_connections``) may use
    reserved: int
    #: client connections open right now, on the whole server
    in_use: int

    @property
    def allowed(self) -> int:
        """Connections ordinary logins may open."""
        return self.max_connections - self.reserved


def connection_limits(conn: Connection) -> ConnectionLimits:
    """What PostgreSQL allows, and how much of it is in use now."""
    most, superuser, reserved, in_use = conn.execute(CONNECTION_LIMITS).one()
    return ConnectionLimits(int(most), int(superuser) + int(reserved), int(in_use))


# Heartbeats (migration 0012) and, for workers of older releases, the attempt history.
WORKERS = text(
    """
    WITH recent AS (
        SELECT worker, count(*) AS attempts, max(at) AS last_attempt
          FROM notification_attempts
         WHERE at > now() - interval '1 hour' AND worker NOT LIKE 'console:%'
         GROUP BY worker)
    SELECT coalesce(w.name, r.worker) AS name, w.started_at, w.last_seen,
           w.alive_until > now() AS alive, coalesce(r.attempts, 0) AS attempts,
           r.last_attempt,
           (SELECT count(*) FROM notifications n
             WHERE n.status = 'processing' AND n.locked_until IS NOT NULL
               AND n.claimed_by = coalesce(w.name, r.worker))
             AS holding
      FROM workers w FULL JOIN recent r ON r.worker = w.name
     WHERE w.name IS NULL OR w.alive_until > now() - interval '1 hour'
     ORDER BY alive DESC NULLS LAST, name
    """
)


def seen(conn: Connection) -> list[dict[str, Any]]:
    """Workers alive or seen in the last hour, the live ones first: their heartbeat, their
    attempts of the last hour and the rows they hold."""
    return [dict(r) for r in conn.execute(WORKERS).mappings()]
