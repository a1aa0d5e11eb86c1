"""Worker heartbeats, so the rescue takes a dead worker's rows back long before their lease.

Each worker process that claims rows keeps one row in ``workers`` under the name it writes into
``notifications.claimed_by``, renewed every ``NOTIFIER_HEARTBEAT_SECONDS`` by a thread of its
own; ``alive_until`` is how long the last renewal vouches for it. Additive: older workers never
read the table and write no row, so their claims are rescued by the lease alone, as before.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE workers (
            name text PRIMARY KEY,
            started_at timestamptz NOT NULL DEFAULT now(),
            last_seen timestamptz NOT NULL DEFAULT now(),
            alive_until timestamptz NOT NULL,
            CONSTRAINT workers_alive_after_seen CHECK (alive_until >= last_seen)
        )
        """
    )
    op.execute(
        "COMMENT ON TABLE workers IS 'One row per worker process that claims notifications,"
        " renewed by its heartbeat; read by the rescue and notifier health.'"
    )
    # In the style of 0010: workers write their own rows and delete long-gone ones (in the
    # rescue); operators read them for notifier health.
    op.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON workers TO notifier_worker")
    op.execute("GRANT SELECT ON workers TO notifier_operator")


def downgrade() -> None:
    op.execute("DROP TABLE workers")
