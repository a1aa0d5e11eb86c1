"""Campaigns to people: a campaign's audience is addresses (as before) or profiles.

``campaigns.audience`` is ``addresses`` (the default: every campaign so far) or ``profiles``:
then each audience entry is a profile's id, and each notification names it in ``profile``
with ``recipient`` left empty, so the address, locale, preferences, quiet hours and caps of the
person apply when it is sent. A person gets at most one notification of a campaign: the unique
index on ``(campaign_id, recipient)`` now covers rows without a profile, and one on
``(campaign_id, profile)`` rows with one. Both are built CONCURRENTLY under new names, then
swapped, so producers' INSERTs never wait on them.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-15
"""

from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def _unique(name: str, columns: str, predicate: str) -> None:
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}_new")
        op.execute(
            f"CREATE UNIQUE INDEX CONCURRENTLY {name}_new ON notifications ({columns})"
            f" WHERE {predicate}"
        )
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
        op.execute(f"ALTER INDEX {name}_new RENAME TO {name}")


def upgrade() -> None:
    op.execute(
        "ALTER TABLE campaigns ADD COLUMN audience text NOT NULL DEFAULT 'addresses'"
        " CONSTRAINT campaigns_audience CHECK (audience IN ('addresses', 'profiles'))"
    )
    _unique(
        "notifications_campaign_recipient",
        "campaign_id, recipient",
        "campaign_id IS NOT NULL AND profile IS NULL",
    )
    _unique(
        "notifications_campaign_profile",
        "campaign_id, profile",
        "campaign_id IS NOT NULL AND profile IS NOT NULL",
    )


def downgrade() -> None:
    op.execute("DELETE FROM notifications WHERE campaign_id IS NOT NULL AND profile IS NOT NULL")
    with op.get_context().autocommit_block():
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS notifications_campaign_profile")
    _unique("notifications_campaign_recipient", "campaign_id, recipient", "campaign_id IS NOT NULL")
    op.execute("ALTER TABLE campaigns DROP COLUMN audience")
