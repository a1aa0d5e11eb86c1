"""The only package that talks to PostgreSQL: every statement notifier runs, named by intent.

``engine`` the process's engine; ``trips`` a transaction sent in one round trip; ``tables``
the schema as SQLAlchemy tables; ``queue`` the dispatcher's claim and guarded transitions;
``rescue`` taking rows back from dead workers; ``producers`` enqueue and cancel; ``wakeups``
the LISTEN connection; ``workers`` heartbeats and the connection budget, ``pooler`` a
PgBouncer's limits for it; ``campaigns``, ``launches`` and ``audience`` the campaigns, their
fan-out and their imports; ``templates`` and
``suppressions`` what they say; ``events`` providers' reports; ``status_events`` the status
webhook's outbox; ``rows`` one row's story and history, ``stats`` the counts and gauges,
``listing`` the console's lists, ``bulk`` the operators' bulk changes; ``migrate`` the schema's
migrations; ``errors`` what a person can do about a database that cannot be reached. Every
statement is written with ``:name`` parameters (``notifier.db.sql``).
"""

from notifier.db.engine import (
    POOL_OVERFLOW,
    POOL_SIZE,
    dispose_engine,
    driver,
    engine,
    make_engine,
    session_engine,
    without_ping,
)

__all__ = [
    "POOL_OVERFLOW",
    "POOL_SIZE",
    "dispose_engine",
    "driver",
    "engine",
    "make_engine",
    "session_engine",
    "without_ping",
]
