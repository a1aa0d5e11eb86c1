"""Operations: the attempt history by time, for ``notifier stats``' throughput.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # "What happened in the last few minutes?" reads a thin slice of a table that grows by one
    # row per attempt; without this it is a scan of all of it. Attempts are written in bulk,
    # once per batch, so the extra index costs little. (CREATE INDEX takes a write lock on the
    # table while it builds: on a large existing history, expect attempt writes to wait.)
    op.execute("CREATE INDEX notification_attempts_at ON notification_attempts (at)")


def downgrade() -> None:
    op.execute("DROP INDEX notification_attempts_at")
