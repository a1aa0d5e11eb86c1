"""What a PgBouncer in front of PostgreSQL allows, read from its admin console.

A worker behind a transaction pooler (``NOTIFIER_DATABASE_POOLER=transaction``) checks its
connection budget against two limits instead of one: the pooler's clients (``max_client_conn``)
and the server connections the pooler may open for notifier's database, which PostgreSQL must
have room for beside the sessions that bypass the pooler. PgBouncer says both on its admin
console, the database ``pgbouncer`` on its own port, to the logins in its ``admin_users`` or
``stats_users``: ``SHOW CONFIG``, ``SHOW DATABASES`` and ``SHOW POOLS``. The console speaks
only the simple query protocol, which psycopg uses for a statement without parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row
from sqlalchemy.engine import make_url

from notifier.db.engine import own_connection

#: The admin console's database name, on the pooler's own host and port.
ADMIN_DATABASE = "pgbouncer"

#: What the driver raises when the console cannot be reached or refuses the login.
DriverError = psycopg.Error


@dataclass(frozen=True, slots=True)
class PoolerLimits:
    """A PgBouncer's limits for one database."""

    #: the database's name as clients give it (the pooler's alias)
    database: str
    #: clients the pooler accepts at once, over all its databases
    max_client_conn: int
    #: server connections one pool (this database and one login) keeps for its clients
    pool_size: int
    #: more server connections a pool may open when a client has waited ``reserve_pool_timeout``
    reserve_pool: int
    #: the most server connections to this database over all its pools; 0: no such limit
    max_db_connections: int
    #: the pools (one per login) the pooler has for this database now, at least 1
    pools: int
    #: the database's pool mode: ``session``, ``transaction`` or ``statement``
    pool_mode: str

    @property
    def server_connections(self) -> int:
        """The most server connections the pooler may open to this database."""
        most = (self.pool_size + self.reserve_pool) * self.pools
        return min(most, self.max_db_connections) if self.max_db_connections else most


def pooler_limits(database_url: str) -> PoolerLimits:
    """The limits of the PgBouncer that ``database_url`` goes through, for its database, read
    with the same login; raises ``DriverError`` when its admin console refuses it or it is no
    PgBouncer at all. A database that ``SHOW DATABASES`` does not list yet (served by a ``*``
    entry, before its first client) has the pooler's defaults."""
    url = make_url(database_url)
    name = url.database or ""
    with own_connection(
        url.set(database=ADMIN_DATABASE).render_as_string(hide_password=False),
        application_name="notifier-budget",
    ) as conn:
        config = {str(key): str(value) for key, value, *_ in conn.execute("SHOW CONFIG")}
        databases = _rows(conn, "SHOW DATABASES")
        pools = _rows(conn, "SHOW POOLS")
    entry = next((row for row in databases if row["name"] == name), None)
    logins = sum(1 for row in pools if row["database"] == name)
    if entry is None:
        pool_size = int(config["default_pool_size"])
        reserve, most, mode = int(config["reserve_pool_size"]), 0, config["pool_mode"]
    else:
        pool_size, reserve = int(entry["pool_size"]), int(entry["reserve_pool"])
        most, mode = int(entry["max_connections"]), str(entry["pool_mode"] or config["pool_mode"])
    global_most = int(config.get("max_db_connections", "0"))
    if global_most and (not most or global_most < most):
        most = global_most
    return PoolerLimits(
        database=name,
        max_client_conn=int(config["max_client_conn"]),
        pool_size=pool_size,
        reserve_pool=reserve,
        max_db_connections=most,
        pools=max(logins, 1),
        pool_mode=mode,
    )


def _rows(conn: psycopg.Connection[Any], statement: str) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(statement).fetchall()
