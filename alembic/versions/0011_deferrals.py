"""Deferrals counted per row, so a row a receiver keeps throttling ends with a reason.

A provider's "slow down" (HTTP 429) hands a row back without using up an attempt; ``deferrals``
counts those hand-backs, and past ``NOTIFIER_MAX_DEFERRALS`` the row is given up as ``dead``.
Additive: a column with a default, which old workers never read or write.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-30
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE notifications ADD COLUMN deferrals integer NOT NULL DEFAULT 0")


def downgrade() -> None:
    op.execute("ALTER TABLE notifications DROP COLUMN deferrals")
