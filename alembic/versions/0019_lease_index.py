"""The lease index indexes leases: ``WHERE locked_until IS NOT NULL``, not ``status``.

Every guarded write of the dispatcher says ``status = 'processing' AND claim_token = ...``,
which proved the old predicate, so the planner could read a group's rows through
``notifications_lease``: it estimated one row there and put it on the outer side of a nested
loop over the group's ``unnest``, which then ran once per row of the whole batch (476 x 74
comparisons, 4 to 7 ms a group of outcomes instead of under 1 ms). And until a vacuum that
index holds an entry for every row version ever claimed, so any plan through it slows as a
drain goes on. A ``processing`` row always has a lease (the
``notifications_processing_has_lease`` CHECK), and every transition notifier makes out of
``processing`` clears it (a producer's own cancel of a claimed row may leave it: such rows stay
in the index, and ``status`` filters them out). With ``locked_until IS NOT NULL`` as the
predicate, the statements that look for leases (the rescue, the gauges, the console) state it
and use the index; the guarded writes cannot, and go by the primary key.

Built CONCURRENTLY under a new name, then swapped, so producers' INSERTs never wait on it;
a build that failed half way leaves an INVALID index, which the next run drops and rebuilds.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-10
"""

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def _swap(predicate: str) -> None:
    with op.get_context().autocommit_block():
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS notifications_lease_new")
        op.execute(
            "CREATE INDEX CONCURRENTLY notifications_lease_new"
            f" ON notifications (locked_until) WHERE {predicate}"
        )
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS notifications_lease")
        op.execute("ALTER INDEX notifications_lease_new RENAME TO notifications_lease")


def upgrade() -> None:
    _swap("locked_until IS NOT NULL")


def downgrade() -> None:
    _swap("status = 'processing'")
