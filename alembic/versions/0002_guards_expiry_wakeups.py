"""Send-time guards, expiry, and wake-ups on insert.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE notifications ADD COLUMN guard text")
    op.execute("ALTER TABLE notifications ADD COLUMN expires_at timestamptz")
    # One NOTIFY per INSERT statement (not per row, so a bulk insert costs one), carrying the
    # earliest time one of its pending rows is due, as Unix seconds. Delivered on commit only.
    op.execute(
        """
        CREATE FUNCTION notifier_wake() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE
            due double precision;
        BEGIN
            SELECT extract(epoch FROM min(next_attempt_at)) INTO due
              FROM new_rows WHERE status = 'pending';
            IF due IS NOT NULL THEN
                PERFORM pg_notify('notifier_wake', due::text);
            END IF;
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER notifications_wake
            AFTER INSERT ON notifications
            REFERENCING NEW TABLE AS new_rows
            FOR EACH STATEMENT EXECUTE FUNCTION notifier_wake()
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER notifications_wake ON notifications")
    op.execute("DROP FUNCTION notifier_wake()")
    op.execute("ALTER TABLE notifications DROP COLUMN expires_at")
    op.execute("ALTER TABLE notifications DROP COLUMN guard")
