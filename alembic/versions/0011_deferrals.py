"""Deferrals counted per row, so a row a receiver keeps throttling ends with a reason.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-30
"""

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
