"""The schema's migrations: create the database if it is missing, then upgrade (or roll back).

The migrations are Alembic's, in ``alembic/`` at the top of the repository; a wheel carries them
as ``notifier/_migrations``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Connection, create_engine, text
from sqlalchemy.engine import make_url

from notifier.settings import get_settings


def alembic_dir() -> Path:
    """The migrations: ``notifier/_migrations`` once installed from a wheel (pyproject.toml puts
    them there), the repository's ``alembic/`` in a checkout or an editable install."""
    package = Path(__file__).resolve().parents[1]
    for place in (package / "_migrations", package.parent / "alembic"):
        if (place / "env.py").is_file():
            return place
    raise FileNotFoundError(f"notifier's migrations are missing from {package}: reinstall it")


def migrate(
    database_url: str | None = None,
    *,
    down_to: str | None = None,
    say: Callable[[str], object] = print,
) -> None:
    """Create the database if it does not exist, then upgrade it to the newest schema; or, with
    ``down_to`` (a revision such as ``0011``), undo the migrations after that one.

    Without ``database_url``, on ``NOTIFIER_DATABASE_SESSION_URL`` (``NOTIFIER_DATABASE_URL``
    when unset): a migration reaches the ``postgres`` database, which a pooler may not serve,
    and builds indexes outside any transaction."""
    # Alembic logs each of its built-in plugins at INFO as it loads them: noise before the
    # one line that says what happened.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    from alembic import command
    from alembic.config import Config

    url = make_url(database_url or get_settings().session_database_url)
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        exists = conn.execute(
            text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": url.database}
        ).first()
        if not exists:
            quoted = conn.dialect.identifier_preparer.quote(url.database or "notifier")
            conn.execute(text(f"CREATE DATABASE {quoted}"))
            say(f"created database {url.database}")
    admin.dispose()

    config = Config()
    config.set_main_option("script_location", str(alembic_dir()))
    config.attributes["configure_logging"] = False
    engine = create_engine(url)
    # Each migration commits on its own (``transaction_per_migration`` in env.py), so one that
    # builds an index CONCURRENTLY can step outside a transaction for it.
    try:
        with engine.connect() as conn:
            config.attributes["connection"] = conn
            if down_to is None:
                command.upgrade(config, "head")
                grant_database(conn, url.database or "")
            else:
                command.downgrade(config, down_to)
    finally:  # a migration that fails leaves no connection behind in the pool
        engine.dispose()
    where = "the newest schema" if down_to is None else f"revision {down_to}"
    say(f"database {url.database} is at {where}")


#: The database's own privileges (not its schema's) that notifier's roles need: the API writes a
#: batch through a temporary table of its session (``api.write_requests``). PostgreSQL grants
#: ``TEMPORARY`` to ``PUBLIC`` by default and hardened databases revoke it; a grant on a database
#: is not carried by a dump restored into another or a copy made from it as a template, so it is
#: made again by every ``notifier migrate`` rather than once by a migration.
DATABASE_GRANTS = {"notifier_api": "TEMPORARY"}


def grant_database(conn: Connection, database: str) -> None:
    """Grant notifier's roles what they need of ``database`` (``DATABASE_GRANTS``), from a
    connection to any database of the server, and commit."""
    quote = conn.dialect.identifier_preparer.quote
    present = conn.execute(
        text("SELECT rolname FROM pg_roles WHERE rolname = ANY(:roles)"),
        {"roles": list(DATABASE_GRANTS)},
    ).scalars()
    for role in present:
        conn.execute(text(f"GRANT {DATABASE_GRANTS[role]} ON DATABASE {quote(database)} TO {role}"))
    conn.commit()
