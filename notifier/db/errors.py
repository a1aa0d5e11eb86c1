"""What a person can do about a database that is missing or cannot be reached, in one line."""

from __future__ import annotations

import re

import psycopg
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

_MISSING = re.compile(r'database "([^"]*)" does not exist')


def database_missing(exc: BaseException) -> bool:
    """Whether ``exc`` says the database named by the URL does not exist."""
    return _MISSING.search(str(exc)) is not None


def connection_problem(exc: BaseException, database_url: str) -> str | None:
    """One line naming the setting and the fix when ``exc`` is a failure to connect to the
    database (missing, refused, unreachable, refused credentials); ``None`` for anything else."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    if not isinstance(orig, psycopg.OperationalError) or "connection" not in str(orig):
        return None
    url = make_url(database_url)
    where = f"{url.host or 'localhost'}:{url.port or 5432}"
    found = _MISSING.search(str(orig))
    if found:
        return (
            f"database {found[1]!r} does not exist on {where} (NOTIFIER_DATABASE_URL): "
            "correct the name, or create it with `notifier migrate`"
        )
    reason = str(orig).splitlines()[0].split("failed: ")[-1].strip()
    return f"cannot connect to PostgreSQL at {where} (NOTIFIER_DATABASE_URL): {reason}"
