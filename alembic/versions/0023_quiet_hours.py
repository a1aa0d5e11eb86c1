"""Quiet hours: a person's own window, and ``held``, the outcome of a row they held back.

``profiles.quiet_start`` and ``quiet_end`` are a person's own quiet hours (wall-clock times in
their ``time_zone``; past midnight when the start is later), both or neither. A row held back by
quiet hours goes back to ``pending`` until the window ends, its attempt given back and no
deferral counted, and its history says so with the outcome ``held``.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-14
"""

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

BEFORE = (
    "'sent', 'retry', 'deferred', 'dead', 'cancelled', 'rescued', 'requeued',"
    " 'delivered', 'undelivered', 'bounced', 'complained'"
)


def _outcomes(allowed: str) -> None:
    # NOT VALID, then VALIDATE: the history is the largest table, and VALIDATE lets inserts go on.
    op.execute(
        "ALTER TABLE notification_attempts DROP CONSTRAINT notification_attempts_outcome,"
        " ADD CONSTRAINT notification_attempts_outcome"
        f" CHECK (outcome IN ({allowed})) NOT VALID"
    )
    op.execute(
        "ALTER TABLE notification_attempts VALIDATE CONSTRAINT notification_attempts_outcome"
    )


def upgrade() -> None:
    op.execute("ALTER TABLE profiles ADD COLUMN quiet_start time, ADD COLUMN quiet_end time")
    op.execute(
        "ALTER TABLE profiles ADD CONSTRAINT profiles_quiet_hours"
        " CHECK ((quiet_start IS NULL) = (quiet_end IS NULL) AND quiet_start <> quiet_end)"
    )
    _outcomes(f"{BEFORE}, 'held'")


def downgrade() -> None:
    op.execute("DELETE FROM notification_attempts WHERE outcome = 'held'")
    _outcomes(BEFORE)
    op.execute("ALTER TABLE profiles DROP COLUMN quiet_start, DROP COLUMN quiet_end")
