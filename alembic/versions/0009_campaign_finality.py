"""Campaign cancel and purge are final.

``campaign_chunks`` records the position ranges launches have written, one row per chunk in the
chunk's transaction. It outlives ``notifier purge``, so a launch never writes a recorded position
again. Campaigns launched before this revision get one range: up to their last recipient with a
notification (a campaign still ``launching`` gets none; re-running its launch finds its rows by
the unique index, as before).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE campaign_chunks (
            campaign_id     bigint NOT NULL,
            first_position  bigint NOT NULL,
            last_position   bigint NOT NULL,
            written         bigint NOT NULL,
            at              timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (campaign_id, first_position),
            CONSTRAINT campaign_chunks_range
                CHECK (first_position >= 1 AND last_position >= first_position)
        )
        """
    )
    op.execute(
        """
        INSERT INTO campaign_chunks (campaign_id, first_position, last_position, written)
        SELECT c.id, 1, max(r.position), count(*)
          FROM campaigns AS c
          JOIN campaign_recipients AS r ON r.campaign_id = c.id
          JOIN notifications AS n ON n.campaign_id = r.campaign_id AND n.recipient = r.recipient
         WHERE c.status IN ('running', 'paused', 'cancelled')
         GROUP BY c.id
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE campaign_chunks")
