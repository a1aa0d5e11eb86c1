"""A cheaper attempt history: one B-tree and one BRIN index instead of three B-trees.

Every attempt a worker records is a row of ``notification_attempts``, so each of its indexes
is paid on the hot path, once per send. The table had three B-trees: its ``id`` key, the
lookup by notification (``notification_id, id``) and the time index for the console's and
``notifier stats``'s per-minute counts (``at``). Now the primary key is ``(notification_id,
id)``, which serves the lookup by notification (a row's story, the purge) by itself, and
``at`` has a BRIN index: the table is appended to in time order, so a block range summary
finds an hour's attempts as well as a B-tree did, and costs next to nothing to keep. Its
block ranges are summarized as they fill (``autosummarize``), so only the newest range is
always read.

Readers see no change: the columns are the same, ``id`` stays unique (an identity), and every
query keeps an index. Downgrade restores the three B-trees.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE notification_attempts DROP CONSTRAINT notification_attempts_pkey")
    op.execute("DROP INDEX notification_attempts_by_notification")
    op.execute(
        "ALTER TABLE notification_attempts"
        " ADD CONSTRAINT notification_attempts_pkey PRIMARY KEY (notification_id, id)"
    )
    op.execute("DROP INDEX notification_attempts_at")
    op.execute(
        "CREATE INDEX notification_attempts_at ON notification_attempts USING brin (at)"
        " WITH (autosummarize = on)"
    )


def downgrade() -> None:
    op.execute("DROP INDEX notification_attempts_at")
    op.execute("CREATE INDEX notification_attempts_at ON notification_attempts (at)")
    op.execute("ALTER TABLE notification_attempts DROP CONSTRAINT notification_attempts_pkey")
    op.execute(
        "ALTER TABLE notification_attempts"
        " ADD CONSTRAINT notification_attempts_pkey PRIMARY KEY (id)"
    )
    op.execute(
        "CREATE INDEX notification_attempts_by_notification"
        " ON notification_attempts (notification_id, id)"
    )
