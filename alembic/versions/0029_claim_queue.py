"""The claim reads a queue of its own, ``notification_queue``, not ``notifications``.

A claim walked ``notifications_due``, the partial index of pending rows, from its head. A
claimed row's entry stays in that index until ``notifications`` is vacuumed, and it sorts
before every row due after it, so each claim read the entries of all rows claimed since the
last vacuum: about 8 ms more a 1,000-row claim for each million (docs/scaling.md). Autovacuum
takes a table once a fifth of its rows are dead, so with 50,000,000 rows of history the claim
read millions of dead entries between two vacuums.

Now a pending row has an entry in ``notification_queue``: its id, its priority and its
``next_attempt_at``, in an index in the claim's order. The claim takes the entries of the due
rows it claims and deletes them. The table holds only what waits, so it stays small and
autovacuum takes it often and cheaply (its threshold is a fifth of what waits, not of
everything ever sent), whatever the history beside it.

The entries are kept by triggers, so producers write ``notifications`` as before:

- ``notifications_queue_inserted``: an INSERT's pending rows, once per statement, from its
  transition table (as ``notifications_wake`` and ``notifications_producer_named`` read theirs).
- ``notifications_queue_changed``: a row that becomes pending (a retry, a deferral, a rescue, an
  operator's requeue) gets an entry; a pending row whose priority or time changes gets a new
  one; a pending row that is cancelled or deleted loses its own. Only those rows fire it (its
  ``WHEN``): a claim takes its entries itself, and a send or a purge touches no pending row.
- ``notifications_queue_truncated``: a TRUNCATE of ``notifications`` empties the queue.

So a pending row has one entry, and an entry is a pending row's. A write with triggers off
(``session_replication_role = replica``) keeps no entries: the claim deletes an entry whose row
no longer matches it (not pending, or another priority or time) without claiming anything, and
docs/operations.md gives the statement that queues pending rows that have none. The functions are
definers (the queue is not the producers' to write), pinned like every other (0020). Workers
read and take entries; no other role sees the table.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-04
"""

from alembic import op
from sqlalchemy import text

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None

# Each trigger's function: a definer that returns nothing, its body given in SQL.
BODIES = {
    "notifier_queue_inserted": """
        INSERT INTO {schema}.notification_queue (id, priority, next_attempt_at)
        SELECT i.id, i.priority, i.next_attempt_at
          FROM notifier_inserted i
         WHERE i.status = 'pending';
    """,
    "notifier_queue_changed": """
        IF OLD.status = 'pending' THEN
            DELETE FROM {schema}.notification_queue WHERE id = OLD.id;
        END IF;
        IF TG_OP = 'UPDATE' AND NEW.status = 'pending' THEN
            INSERT INTO {schema}.notification_queue (id, priority, next_attempt_at)
            VALUES (NEW.id, NEW.priority, NEW.next_attempt_at);
        END IF;
    """,
    "notifier_queue_truncated": """
        TRUNCATE {schema}.notification_queue;
    """,
}

FUNCTION = """
    CREATE FUNCTION {schema}.{name}() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, {schema}, pg_temp
    AS $$
    BEGIN
        {body}
        RETURN NULL;
    END
    $$
"""

TRIGGERS = (
    "CREATE TRIGGER notifications_queue_inserted AFTER INSERT ON notifications"
    " REFERENCING NEW TABLE AS notifier_inserted FOR EACH STATEMENT"
    " EXECUTE FUNCTION {schema}.notifier_queue_inserted()",
    "CREATE TRIGGER notifications_queue_changed"
    " AFTER UPDATE OF status, priority, next_attempt_at ON notifications FOR EACH ROW"
    " WHEN ((NEW.status = 'pending' AND (OLD.status <> 'pending' OR OLD.priority <> NEW.priority"
    " OR OLD.next_attempt_at <> NEW.next_attempt_at))"
    " OR (OLD.status = 'pending' AND NEW.status NOT IN ('pending', 'processing')))"
    " EXECUTE FUNCTION {schema}.notifier_queue_changed()",
    "CREATE TRIGGER notifications_queue_deleted AFTER DELETE ON notifications FOR EACH ROW"
    " WHEN (OLD.status = 'pending') EXECUTE FUNCTION {schema}.notifier_queue_changed()",
    "CREATE TRIGGER notifications_queue_truncated AFTER TRUNCATE ON notifications"
    " FOR EACH STATEMENT EXECUTE FUNCTION {schema}.notifier_queue_truncated()",
)


def _schema() -> str:
    return str(op.get_bind().execute(text("SELECT quote_ident(current_schema())")).scalar_one())


def upgrade() -> None:
    schema = _schema()
    op.execute(
        """
        CREATE TABLE notification_queue (
            id              bigint      NOT NULL,
            priority        integer     NOT NULL,
            next_attempt_at timestamptz NOT NULL
        )
        """
    )
    op.execute(
        "COMMENT ON TABLE notification_queue IS 'What the claim reads: an entry for each pending"
        " notification, written by triggers on notifications; see docs/scaling.md.'"
    )
    op.execute(
        "CREATE INDEX notification_queue_due"
        " ON notification_queue (priority DESC, next_attempt_at, id)"
    )
    op.execute("CREATE INDEX notification_queue_id ON notification_queue (id)")
    for name, body in BODIES.items():
        op.execute(FUNCTION.format(schema=schema, name=name, body=body.format(schema=schema)))
        op.execute(f"REVOKE ALL ON FUNCTION {schema}.{name}() FROM PUBLIC")
    # The rows pending now, under a lock that holds off writers until the triggers are in.
    op.execute("LOCK TABLE notifications IN SHARE ROW EXCLUSIVE MODE")
    for trigger in TRIGGERS:
        op.execute(trigger.format(schema=schema))
    op.execute(
        "INSERT INTO notification_queue (id, priority, next_attempt_at)"
        " SELECT id, priority, next_attempt_at FROM notifications WHERE status = 'pending'"
    )
    op.execute("GRANT SELECT, UPDATE, DELETE ON notification_queue TO notifier_worker")


def downgrade() -> None:
    for trigger in TRIGGERS:
        op.execute(f"DROP TRIGGER {trigger.split()[2]} ON notifications")
    for name in BODIES:
        op.execute(f"DROP FUNCTION {name}()")
    op.execute("DROP TABLE notification_queue")
