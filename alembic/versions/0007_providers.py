"""Which provider answered: on the row once sent, and on every attempt.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE notifications ADD COLUMN provider text")
    op.execute("ALTER TABLE notification_attempts ADD COLUMN provider text")


def downgrade() -> None:
    op.execute("ALTER TABLE notification_attempts DROP COLUMN provider")
    op.execute("ALTER TABLE notifications DROP COLUMN provider")
