"""Moving a test's database to another revision, to test what a migration does to old data."""

from __future__ import annotations

from sqlalchemy import Engine


def migrate(engine: Engine, revision: str) -> None:
    """Upgrade to ``head``, or downgrade to ``revision``."""
    from alembic import command
    from alembic.config import Config

    from notifier.db.migrate import alembic_dir

    config = Config()
    config.set_main_option("script_location", str(alembic_dir()))
    config.attributes["configure_logging"] = False
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        if revision == "head":
            command.upgrade(config, revision)
        else:
            command.downgrade(config, revision)
