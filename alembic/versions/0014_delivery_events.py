"""Delivery feedback: what providers report after they accepted a message.

``notifier events`` receives providers' delivery webhooks and writes what they say into the row
(``delivery_status``, ``delivery_at``, ``delivery_detail``) and into its attempt history, whose
outcomes gain ``delivered``, ``undelivered``, ``bounced`` and ``complained``. Twilio reports by
the message's SID, so ``provider_message_id`` gets an index for the lookup.

Additive: three nullable columns, a wider CHECK on the attempt history, one partial index.
Workers of an older release never read or write them.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

OUTCOMES = "'sent', 'retry', 'deferred', 'dead', 'cancelled', 'rescued', 'requeued'"
DELIVERY = "'delivered', 'undelivered', 'bounced', 'complained'"


def upgrade() -> None:
    op.execute(
        "ALTER TABLE notifications"
        " ADD COLUMN delivery_status text,"
        " ADD COLUMN delivery_at timestamptz,"
        " ADD COLUMN delivery_detail text"
    )
    op.execute(
        "ALTER TABLE notifications ADD CONSTRAINT notifications_delivery_status"
        f" CHECK (delivery_status IN ({DELIVERY}))"
    )
    op.execute(
        "ALTER TABLE notifications ADD CONSTRAINT notifications_delivery_has_time"
        " CHECK ((delivery_status IS NULL) = (delivery_at IS NULL))"
    )
    op.execute(
        "CREATE INDEX notifications_provider_message_id ON notifications (provider_message_id)"
        " WHERE provider_message_id IS NOT NULL"
    )
    op.execute(
        "ALTER TABLE notification_attempts DROP CONSTRAINT notification_attempts_outcome,"
        " ADD CONSTRAINT notification_attempts_outcome"
        f" CHECK (outcome IN ({OUTCOMES}, {DELIVERY}))"
    )
    # In the style of 0010: workers (and the events endpoint, which runs as a worker login)
    # already may UPDATE notifications and INSERT attempts; producers may read how their rows
    # fared.
    op.execute(
        "GRANT SELECT (delivery_status, delivery_at, delivery_detail) ON notifications"
        " TO notifier_producer"
    )


def downgrade() -> None:
    op.execute(
        "REVOKE SELECT (delivery_status, delivery_at, delivery_detail) ON notifications"
        " FROM notifier_producer"
    )
    op.execute(f"DELETE FROM notification_attempts WHERE outcome IN ({DELIVERY})")
    op.execute(
        "ALTER TABLE notification_attempts DROP CONSTRAINT notification_attempts_outcome,"
        f" ADD CONSTRAINT notification_attempts_outcome CHECK (outcome IN ({OUTCOMES}))"
    )
    op.execute("DROP INDEX notifications_provider_message_id")
    op.execute(
        "ALTER TABLE notifications"
        " DROP COLUMN delivery_status, DROP COLUMN delivery_at, DROP COLUMN delivery_detail"
    )
