"""The only package that talks to PostgreSQL: every statement notifier runs, named by intent.

``engine`` the process's engine; ``queue`` the dispatcher's claim and guarded transitions;
``rescue`` taking rows back from dead workers; ``producers`` enqueue and cancel; ``wakeups``
the LISTEN connection; ``workers`` heartbeats and the connection budget; ``campaigns`` and
``audience`` the campaigns' fan-out and imports; ``content`` templates and suppressions; ``ops``
the operators' reads and bulk changes; ``migrate`` the schema's migrations; ``errors`` what a
person can do about a database that cannot be reached. Every statement is written with
``:name`` parameters (``notifier.db.sql``).
"""

from notifier.db.engine import POOL_OVERFLOW, POOL_SIZE, dispose_engine, driver, engine, make_engine

__all__ = ["POOL_OVERFLOW", "POOL_SIZE", "dispose_engine", "driver", "engine", "make_engine"]
