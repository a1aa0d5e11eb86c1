"""A campaign whose every row is final becomes ``finished``.

A ``running`` campaign is ``finished`` once it is fully launched (no launch under way, every
audience position written) and none of its rows is ``pending`` or ``processing``. Beat's
``finish-campaigns`` sweep (running as the worker) and ``notifier campaign status`` make that
move; a launch of new audience members makes it ``running`` again. The sweep reads the
campaign's chunks and last position, so the worker role may now read those and change a
campaign's status.

The downgrade makes finished campaigns ``running`` again, as they were before.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-03
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

STATUSES = "'draft', 'launching', 'running', 'paused', 'cancelled'"


def upgrade() -> None:
    op.execute(
        "ALTER TABLE campaigns DROP CONSTRAINT campaigns_status,"
        f" ADD CONSTRAINT campaigns_status CHECK (status IN ({STATUSES}, 'finished'))"
    )
    op.execute("GRANT UPDATE (status, updated_at) ON campaigns TO notifier_worker")
    op.execute("GRANT SELECT ON campaign_chunks TO notifier_worker")
    op.execute("GRANT SELECT (campaign_id, position) ON campaign_recipients TO notifier_worker")


def downgrade() -> None:
    op.execute("REVOKE SELECT (campaign_id, position) ON campaign_recipients FROM notifier_worker")
    op.execute("REVOKE SELECT ON campaign_chunks FROM notifier_worker")
    op.execute("REVOKE UPDATE (status, updated_at) ON campaigns FROM notifier_worker")
    op.execute(
        "UPDATE campaigns SET status = 'running', updated_at = now() WHERE status = 'finished'"
    )
    op.execute(
        "ALTER TABLE campaigns DROP CONSTRAINT campaigns_status,"
        f" ADD CONSTRAINT campaigns_status CHECK (status IN ({STATUSES}))"
    )
