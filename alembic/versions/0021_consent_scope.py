"""Consent has a scope: a row's category, and what each kind of suppression covers.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-12
"""

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
