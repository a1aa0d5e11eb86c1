"""Definer functions that callers cannot steer, and rows that carry their producer.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-11
"""

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
