"""The console: operators' actions in the attempt history.

A requeue or cancel made in ``notifier console`` adds a row to ``notification_attempts`` naming
the operator (``worker`` = ``console:<user>``), so a row's history tells who sent it round
again. That needs the outcome ``requeued``, and operators need to INSERT history rows.

The CHECK is replaced NOT VALID and then validated: validating takes only a SHARE UPDATE
EXCLUSIVE lock, so workers keep writing attempts while a long history is checked.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

OUTCOMES = "'sent', 'retry', 'deferred', 'dead', 'cancelled', 'rescued'"


def _outcomes(values: str) -> None:
    op.execute("ALTER TABLE notification_attempts DROP CONSTRAINT notification_attempts_outcome")
    op.execute(
        "ALTER TABLE notification_attempts ADD CONSTRAINT notification_attempts_outcome"
        f" CHECK (outcome IN ({values})) NOT VALID"
    )
    op.execute(
        "ALTER TABLE notification_attempts VALIDATE CONSTRAINT notification_attempts_outcome"
    )


def upgrade() -> None:
    _outcomes(OUTCOMES + ", 'requeued'")
    # In the style of 0010: the console connects as an operator login.
    op.execute("GRANT INSERT ON notification_attempts TO notifier_operator")


def downgrade() -> None:
    op.execute("REVOKE INSERT ON notification_attempts FROM notifier_operator")
    op.execute("DELETE FROM notification_attempts WHERE outcome = 'requeued'")
    _outcomes(OUTCOMES)
