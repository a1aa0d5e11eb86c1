"""The PostgreSQL connections a deployment can open, against what the server allows.

What one worker container can hold at most:

* each pool process (``--concurrency`` of them): its engine's pool, ``POOL_SIZE`` +
  ``POOL_OVERFLOW`` (the dispatcher, and guards' re-checks from send threads), plus its
  heartbeat's connection;
* the main process: the wake-up listener's ``LISTEN`` connection and the one its re-reads
  borrow from the main process's engine (none with ``NOTIFIER_WAKE_ON_INSERT=false``).

Beat and Flower open none. Besides the workers there is ``notifier metrics`` (an engine's pool)
and the short-lived commands: healthchecks, ``notifier migrate``, operators' commands.

Behind a transaction pooler (``NOTIFIER_DATABASE_POOLER=transaction``, docs/pgbouncer.md) the
same connections are the pooler's clients, but for the ``LISTEN``, which goes to PostgreSQL on
``NOTIFIER_DATABASE_SESSION_URL`` like a launch's lock and ``notifier migrate``. PostgreSQL then
sees the pooler's server connections and those sessions (``pooled_verdict``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from notifier.db import POOL_OVERFLOW, POOL_SIZE, pooler
from notifier.db.pooler import PoolerLimits
from notifier.db.workers import ConnectionLimits

log = logging.getLogger(__name__)

#: One pool process: its engine at most, and its heartbeat.
PER_POOL_PROCESS = POOL_SIZE + POOL_OVERFLOW + 1
#: The main process: the LISTEN connection and one for the re-reads of the table.
LISTENER, REREADS = 1, 1
MAIN_PROCESS = LISTENER + REREADS
#: Sessions on the session URL besides the workers' LISTENs: a campaign launch's lock,
#: ``notifier migrate``, an operator's ``psql``.
SESSION_COMMANDS = 3
#: ``notifier metrics`` (an engine's pool) and a few commands at once (healthchecks, migrate).
OUTSIDE_WORKERS = POOL_SIZE + POOL_OVERFLOW + 3
#: Above this share of what PostgreSQL allows, a worker starts with a warning.
WARN_AT = 0.8


@dataclass(frozen=True, slots=True)
class Budget:
    """The connections ``replicas`` worker containers of ``concurrency`` processes can open."""

    concurrency: int
    replicas: int
    wake_on_insert: bool = True

    @property
    def per_container(self) -> int:
        return self.concurrency * PER_POOL_PROCESS + (MAIN_PROCESS if self.wake_on_insert else 0)

    @property
    def needed(self) -> int:
        return self.replicas * self.per_container + OUTSIDE_WORKERS

    def arithmetic(self) -> str:
        main = MAIN_PROCESS if self.wake_on_insert else 0
        return (
            f"{self.replicas} worker(s) x ({self.concurrency} processes x {PER_POOL_PROCESS}"
            f" + {main}) + {OUTSIDE_WORKERS} for metrics and commands"
        )

    @property
    def pooled_per_container(self) -> int:
        """A container's clients of a transaction pooler: all but the LISTEN."""
        return self.concurrency * PER_POOL_PROCESS + (REREADS if self.wake_on_insert else 0)

    @property
    def pooled_needed(self) -> int:
        return self.replicas * self.pooled_per_container + OUTSIDE_WORKERS

    def pooled_arithmetic(self) -> str:
        rereads = REREADS if self.wake_on_insert else 0
        return (
            f"{self.replicas} worker(s) x ({self.concurrency} processes x {PER_POOL_PROCESS}"
            f" + {rereads}) + {OUTSIDE_WORKERS} for metrics and commands"
        )

    @property
    def sessions_needed(self) -> int:
        """Connections on the session URL, bypassing a transaction pooler."""
        return self.replicas * (LISTENER if self.wake_on_insert else 0) + SESSION_COMMANDS

    def sessions_arithmetic(self) -> str:
        listen = LISTENER if self.wake_on_insert else 0
        return (
            f"{self.replicas} worker(s) x {listen} LISTEN + {SESSION_COMMANDS} for launches,"
            " migrate and operators"
        )


def verdict(budget: Budget, limits: ConnectionLimits) -> tuple[str, str] | None:
    """``("fail" | "warn", one line)`` when the deployment does not fit, or nearly; else None."""
    allowed = limits.allowed
    fix = "lower --concurrency or NOTIFIER_EXPECTED_WORKERS, or raise PostgreSQL's max_connections"
    where = (
        f"PostgreSQL allows {allowed} (max_connections {limits.max_connections}"
        f" - {limits.reserved} reserved)"
    )
    if budget.needed > allowed:
        return "fail", (
            f"notifier needs {budget.needed} database connections ({budget.arithmetic()}),"
            f" {where}: {fix}"
        )
    if budget.needed > WARN_AT * allowed:
        return "warn", (
            f"notifier may need {budget.needed} of the {allowed} database connections"
            f" PostgreSQL allows ({budget.arithmetic()}); close to the limit: {fix}"
        )
    if limits.in_use + budget.per_container > allowed:
        return "warn", (
            f"{limits.in_use} of the {allowed} database connections PostgreSQL allows are in use"
            f" and this worker may open {budget.per_container} more: {fix}"
        )
    return None


def read_pooler(database_url: str) -> PoolerLimits | None:
    """The limits of the PgBouncer ``database_url`` goes through; None, with a warning, when
    its admin console cannot tell them."""
    try:
        return pooler.pooler_limits(database_url)
    except pooler.DriverError as exc:
        said = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        log.warning(
            "could not read PgBouncer's limits on its admin console (%s): add notifier's login"
            " to stats_users in pgbouncer.ini; checking only the sessions that bypass it",
            said,
        )
        return None


def pooled_verdict(
    budget: Budget, found: PoolerLimits | None, limits: ConnectionLimits
) -> tuple[str, str] | None:
    """``verdict`` behind a transaction pooler: the workers' clients against the pooler's
    ``max_client_conn``; the pooler's server connections and the sessions that bypass it
    against what PostgreSQL allows. Without ``found`` (the pooler's console was not readable),
    only the sessions."""
    allowed = limits.allowed
    where = (
        f"PostgreSQL allows {allowed} (max_connections {limits.max_connections}"
        f" - {limits.reserved} reserved)"
    )
    server_fix = "raise PostgreSQL's max_connections"
    if found is None:
        if budget.sessions_needed > allowed:
            return "fail", (
                f"notifier needs {budget.sessions_needed} sessions beside PgBouncer"
                f" ({budget.sessions_arithmetic()}), {where}: lower NOTIFIER_EXPECTED_WORKERS,"
                f" or {server_fix}"
            )
        return None
    clients, client_limit = budget.pooled_needed, found.max_client_conn
    client_fix = (
        "raise max_client_conn in pgbouncer.ini, or lower --concurrency or"
        " NOTIFIER_EXPECTED_WORKERS"
    )
    server = found.server_connections + budget.sessions_needed
    server_fix = (
        f"lower PgBouncer's pool_size for {found.database} (or default_pool_size,"
        f" reserve_pool_size, max_db_connections), or {server_fix}"
    )
    pools = (
        f"(pool_size {found.pool_size} + reserve_pool {found.reserve_pool}) x {found.pools} pool(s)"
    )
    if found.server_connections < (found.pool_size + found.reserve_pool) * found.pools:
        pools = f"max_db_connections {found.max_db_connections}"
    servers = (
        f"PgBouncer may open {found.server_connections} server connections to"
        f" {found.database} ({pools}) and notifier {budget.sessions_needed} sessions beside it"
        f" ({budget.sessions_arithmetic()})"
    )
    if clients > client_limit:
        return "fail", (
            f"notifier needs {clients} client connections to PgBouncer"
            f" ({budget.pooled_arithmetic()}), its max_client_conn is {client_limit}: {client_fix}"
        )
    if server > allowed:
        return "fail", f"{servers}: {server} in all, {where}: {server_fix}"
    if found.pool_mode != "transaction":
        return "warn", (
            f"PgBouncer's pool_mode for {found.database} is {found.pool_mode}, and"
            " NOTIFIER_DATABASE_POOLER=transaction: set pool_mode = transaction for it, or"
            " NOTIFIER_DATABASE_POOLER=none"
        )
    if clients > WARN_AT * client_limit:
        return "warn", (
            f"notifier may need {clients} of the {client_limit} client connections PgBouncer"
            f" allows ({budget.pooled_arithmetic()}); close to the limit: {client_fix}"
        )
    if server > WARN_AT * allowed:
        return "warn", f"{servers}: {server} of the {allowed} PostgreSQL allows; {server_fix}"
    return None
