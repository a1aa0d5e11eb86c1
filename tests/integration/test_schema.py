"""The migrations, applied to an empty database, give exactly the schema the code expects."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError

from notifier.db.migrate import alembic_dir, migrate
from notifier.db.tables import metadata, notifications
from notifier.models import Status


def test_migrations_match_the_models(engine: Engine) -> None:
    with engine.connect() as conn:
        # The history's weeks are partitions the database makes and drops (migration 0027):
        # the model is the partitioned table they belong to.
        weeks = set(
            conn.execute(text("SELECT relname FROM pg_class WHERE relispartition")).scalars()
        )
        assert {"notification_attempts_before", "notification_attempts_default"} <= weeks

        def modelled(name: str | None, kind: str, _: object) -> bool:
            return not (kind == "table" and name in weeks)

        context = MigrationContext.configure(conn, opts={"include_name": modelled})
        diff = compare_metadata(context, metadata)
    assert diff == []


def test_check_constraints_and_indexes_match(engine: Engine) -> None:
    with engine.connect() as conn:
        checks = set(
            conn.execute(
                text(
                    "SELECT conname FROM pg_constraint"
                    " WHERE conrelid = 'notifications'::regclass AND contype = 'c'"
                )
            ).scalars()
        )
        due = conn.execute(
            text("SELECT indexdef FROM pg_indexes WHERE indexname = 'notifications_due'")
        ).scalar_one()
    expected = {
        c.name
        for c in notifications.constraints
        if c.name and "CheckConstraint" in type(c).__name__
    }
    assert checks == expected
    assert "(priority DESC, next_attempt_at, id) WHERE (status = 'pending'::text)" in due


def test_status_check_mirrors_the_enum(engine: Engine) -> None:
    with engine.begin() as conn:
        for status in Status:
            conn.execute(
                text(
                    "INSERT INTO notifications (channel, recipient, status, sent_at, claim_token,"
                    " locked_until, last_error) VALUES ('null', 'x', :s, CASE WHEN :s = 'sent'"
                    " THEN now() END, gen_random_uuid(), now(), 'r')"
                ),
                {"s": status.value},
            )
    with pytest.raises(IntegrityError, match="notifications_status"), engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO notifications (channel, recipient, status) VALUES ('n', 'x', 'retry')"
            )
        )


@pytest.mark.parametrize(
    ("columns", "constraint"),
    [
        ("status, sent_at", "'sent', NULL"),
        ("status, sent_at", "'pending', now()"),
        ("status, claim_token", "'processing', NULL"),
        ("status, last_error", "'dead', NULL"),
        ("max_attempts", "0"),
    ],
)
def test_invariants_are_enforced(engine: Engine, columns: str, constraint: str) -> None:
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO notifications (channel, recipient, {columns})"
                f" VALUES ('null', 'x', {constraint})"
            )
        )


def test_producer_contract_defaults(engine: Engine) -> None:
    with engine.begin() as conn:
        row = conn.execute(
            text(
                "INSERT INTO notifications (channel, recipient) VALUES ('email', 'a@example.com')"
                " RETURNING status, attempts, max_attempts, payload, priority,"
                " next_attempt_at <= now(), created_at IS NOT NULL"
            )
        ).one()
        assert tuple(row) == ("pending", 0, 5, {}, 0, True, True)
        again = conn.execute(
            text(
                "INSERT INTO notifications (channel, recipient, dedupe_key) VALUES"
                " ('email', 'a@example.com', 'k'), ('email', 'a@example.com', 'k2')"
                " ON CONFLICT (dedupe_key) DO NOTHING RETURNING id"
            )
        ).all()
        repeat = conn.execute(
            text(
                "INSERT INTO notifications (channel, recipient, dedupe_key)"
                " VALUES ('email', 'a@example.com', 'k') ON CONFLICT (dedupe_key) DO NOTHING"
                " RETURNING id"
            )
        ).all()
    assert len(again) == 2
    assert repeat == []


def test_migrate_rolls_back_to_a_revision_and_forward_again(
    engine: Engine, database_url: str
) -> None:
    """``notifier migrate --down-to`` is docs/production.md's rollback; ``migrate`` undoes it."""

    def version_and_workers_table() -> tuple[str, bool]:
        with engine.connect() as conn:
            version = conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one()
            exists = conn.execute(text("SELECT to_regclass('workers') IS NOT NULL")).scalar_one()
        return version, exists

    head = ScriptDirectory(str(alembic_dir())).get_current_head()
    assert version_and_workers_table() == (head, True)
    migrate(database_url, down_to="0011")
    assert version_and_workers_table() == ("0011", False)
    migrate(database_url)
    assert version_and_workers_table() == (head, True)
