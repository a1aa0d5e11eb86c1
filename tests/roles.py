"""LOGIN users in notifier's group roles, as a deployment makes them (docs/roles.sql).

Roles belong to the whole cluster, so each user's name is unique per test, and ``Logins.drop``
removes them (and everything they own in the test's database) afterwards.
"""

from __future__ import annotations

import uuid

import psycopg
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url


class Logins:
    """Makes LOGIN users in one test's database; ``drop`` removes them all."""

    def __init__(self, engine: Engine, database_url: str) -> None:
        self.engine = engine
        self.database_url = database_url
        self.users: list[str] = []

    def make(self, group: str, *, schema: bool = False) -> str:
        """A new LOGIN user in ``group`` (with a schema of its own, named like it); its name."""
        user = f"notifier_test_{uuid.uuid4().hex[:10]}_{group.removeprefix('notifier_')}"
        with self.engine.begin() as conn:
            conn.execute(text(f"CREATE ROLE {user} LOGIN IN ROLE {group}"))
            if schema:
                conn.execute(text(f"CREATE SCHEMA {user} AUTHORIZATION {user}"))
        self.users.append(user)
        return user

    def url(self, user: str) -> str:
        """The SQLAlchemy URL that logs in as ``user``."""
        return make_url(self.database_url).set(username=user).render_as_string(hide_password=False)

    def dsn(self, user: str) -> str:
        """The psycopg connection string that logs in as ``user``."""
        dsn = make_url(self.url(user)).set(drivername="postgresql")
        return dsn.render_as_string(hide_password=False)

    def connect(self, user: str, **options: str) -> psycopg.Connection[tuple[object, ...]]:
        """A psycopg connection as ``user``; ``options`` are settings for the session."""
        settings = " ".join(f"-c {name}={value}" for name, value in options.items())
        return psycopg.connect(self.dsn(user), options=settings)

    def drop(self) -> None:
        with self.engine.begin() as conn:
            for user in self.users:
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :u"
                    ),
                    {"u": user},
                )
                conn.execute(text(f"DROP OWNED BY {user}"))
                conn.execute(text(f"DROP ROLE {user}"))
