"""Moving a test's database to another revision, to test what a migration does to old data."""

from __future__ import annotations

from sqlalchemy import Engine

from notifier.db.migrate import migrate as run_migrations


def migrate(engine: Engine, revision: str) -> None:
    """Upgrade to ``head``, or downgrade to ``revision``, as ``notifier migrate`` does."""
    url = engine.url.render_as_string(hide_password=False)
    run_migrations(url, down_to=None if revision == "head" else revision, say=lambda _: None)
