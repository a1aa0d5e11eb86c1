"""The status webhook's outbox: an event for every row that reaches a final or delivery state.

A trigger on ``notifications`` writes one ``status_events`` row in the very transaction that
moves a row to ``sent``, ``dead`` or ``cancelled``, or changes its ``delivery_status``: the
dispatcher's outcome writes, the rescue, expiry, operators' changes and producers' own plain
SQL cancels alike, so no path changes a row without its event, and no event is written for a
change that rolled back. ``notifier.status_webhook`` POSTs them to the producers' URL.

The trigger exists only while workers want events. A statement-level trigger with transition
tables makes every UPDATE of ``notifications`` keep its old and new rows for it, enabled or
not, so "off" is no trigger at all: without a webhook the table's writes cost what they did. A
worker with ``NOTIFIER_STATUS_WEBHOOK_URL`` set calls ``notifier_status_webhook(events)`` at
start, which records the events wanted in the one-row table ``status_webhook`` and creates the
trigger with those states as its arguments; a worker without calls it with none, which drops
it. Either changes the trigger only when that changes anything, taking the table's SHARE ROW
EXCLUSIVE lock (writers wait, readers do not) for at most ``lock_timeout`` (2 s).
The trigger runs once per statement: an outcome write of a thousand rows inserts its events
with one INSERT ... SELECT over the statement's transition tables.

Additive: two new tables, two functions, one trigger. Workers of an older release never read
them; their outcome writes fire the trigger like anyone's.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-03
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

STATUSES = ("sent", "dead", "cancelled")
DELIVERY = ("delivered", "undelivered", "bounced", "complained")

# One statement-level trigger, so an outcome write of a thousand rows inserts its events with
# one INSERT ... SELECT over the statement's transition tables, not a thousand function calls.
# Most statements finish no row (claims, retries): one pass over the new rows says so. The
# INSERT is planned at each run (EXECUTE), for the transition tables' real sizes: a plan cached
# from a one-row statement would join a thousand rows by nested loop.
# SECURITY DEFINER: producers, operators and the events endpoint fire it, and none of them may
# write events themselves (a producer could otherwise forge another producer's). No SET clause,
# which would cost a change of search_path on every statement: the table is named with its
# schema. The trigger's arguments are the states wanted.
EVENTS = """
    CREATE FUNCTION notifier_status_events() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    AS $$
    BEGIN
        IF NOT EXISTS (SELECT 1 FROM notifier_new
                        WHERE status = ANY (TG_ARGV) OR delivery_status = ANY (TG_ARGV)) THEN
            RETURN NULL;
        END IF;
        EXECUTE $q$
            INSERT INTO {schema}.status_events
                   (notification_id, kind, state, channel, dedupe_key, detail, occurred_at)
            SELECT n.id, 'status', n.status, n.channel, n.dedupe_key, n.last_error,
                   coalesce(n.sent_at, now())
              FROM notifier_new n JOIN notifier_old o ON o.id = n.id
             WHERE n.status IS DISTINCT FROM o.status AND n.status = ANY ($1)
            UNION ALL
            SELECT n.id, 'delivery', n.delivery_status, n.channel, n.dedupe_key,
                   n.delivery_detail, n.delivery_at
              FROM notifier_new n JOIN notifier_old o ON o.id = n.id
             WHERE n.delivery_status IS DISTINCT FROM o.delivery_status
               AND n.delivery_status = ANY ($1)
             ORDER BY 1
        $q$ USING TG_ARGV;
        RETURN NULL;
    END
    $$
"""

TRIGGER = (
    "CREATE OR REPLACE TRIGGER notifications_status_events AFTER UPDATE ON notifications"
    " REFERENCING OLD TABLE AS notifier_old NEW TABLE AS notifier_new"
    " FOR EACH STATEMENT EXECUTE FUNCTION notifier_status_events(%s)"
)

KNOWN = ", ".join(f"'{s}'" for s in STATUSES + DELIVERY)

# Redefines the trigger for ``events`` (none: dropped), only when that changes anything;
# whether it changed.
CONFIGURE = f"""
    CREATE FUNCTION notifier_status_webhook(events text[]) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = {{schema}}, pg_temp
    AS $$
    DECLARE
        wanted text[] := ARRAY(SELECT DISTINCT e FROM unnest(events) AS e ORDER BY e);
        enabled boolean;
        current text[];
    BEGIN
        IF EXISTS (SELECT 1 FROM unnest(wanted) AS e WHERE e NOT IN ({KNOWN})) THEN
            RAISE EXCEPTION 'unknown status webhook events in %; known: %',
                events, '{", ".join(STATUSES + DELIVERY)}'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        enabled := EXISTS (SELECT 1 FROM pg_trigger
                            WHERE tgrelid = 'notifications'::regclass
                              AND tgname = 'notifications_status_events');
        SELECT s.events INTO current FROM status_webhook s;
        IF enabled = (cardinality(wanted) > 0)
           AND current IS NOT DISTINCT FROM (CASE WHEN cardinality(wanted) > 0 THEN wanted END)
        THEN
            RETURN false;
        END IF;
        SET LOCAL lock_timeout = '2s';
        IF cardinality(wanted) = 0 THEN
            DELETE FROM status_webhook;
            DROP TRIGGER IF EXISTS notifications_status_events ON notifications;
            RETURN true;
        END IF;
        INSERT INTO status_webhook (events) VALUES (wanted)
            ON CONFLICT (only_row) DO UPDATE SET events = EXCLUDED.events, updated_at = now();
        EXECUTE format('{TRIGGER}',
                       (SELECT string_agg(quote_literal(e), ', ') FROM unnest(wanted) AS e));
        RETURN true;
    END
    $$
"""


def upgrade() -> None:
    schema = op.get_bind().exec_driver_sql("SELECT quote_ident(current_schema())").scalar()
    op.execute(
        """
        CREATE TABLE status_webhook (
            only_row boolean PRIMARY KEY DEFAULT true,
            events text[] NOT NULL,
            updated_at timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT status_webhook_one_row CHECK (only_row)
        )
        """
    )
    op.execute(
        "COMMENT ON TABLE status_webhook IS 'The events the status webhook sends, as workers"
        " last configured it; no row: none, and no trigger.'"
    )
    op.execute(
        """
        CREATE TABLE status_events (
            id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
            notification_id bigint NOT NULL,
            kind text NOT NULL,
            state text NOT NULL,
            channel text NOT NULL,
            dedupe_key text,
            detail text,
            occurred_at timestamptz NOT NULL,
            status text NOT NULL DEFAULT 'pending',
            attempts integer NOT NULL DEFAULT 0,
            next_attempt_at timestamptz NOT NULL DEFAULT now(),
            claim_token uuid,
            locked_until timestamptz,
            last_error text,
            created_at timestamptz NOT NULL DEFAULT now(),
            updated_at timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT status_events_kind CHECK (kind IN ('status', 'delivery')),
            CONSTRAINT status_events_status
                CHECK (status IN ('pending', 'processing', 'sent', 'dead')),
            CONSTRAINT status_events_processing_has_claim CHECK
                (status <> 'processing' OR (claim_token IS NOT NULL AND locked_until IS NOT NULL)),
            CONSTRAINT status_events_dead_has_error
                CHECK (status <> 'dead' OR last_error IS NOT NULL)
        )
        """
    )
    op.execute(
        "COMMENT ON TABLE status_events IS 'The status webhook''s outbox: one row per"
        " notification that reached a final or delivery state, POSTed to"
        " NOTIFIER_STATUS_WEBHOOK_URL.'"
    )
    op.execute(
        "CREATE INDEX status_events_due ON status_events (next_attempt_at, id)"
        " WHERE status = 'pending'"
    )
    op.execute(
        "CREATE INDEX status_events_processing ON status_events (locked_until)"
        " WHERE status = 'processing'"
    )
    op.execute(
        "CREATE INDEX status_events_dead ON status_events (updated_at) WHERE status = 'dead'"
    )
    op.execute(EVENTS.format(schema=schema))
    op.execute("REVOKE ALL ON FUNCTION notifier_status_events() FROM PUBLIC")
    op.execute(CONFIGURE.format(schema=schema))
    op.execute("REVOKE ALL ON FUNCTION notifier_status_webhook(text[]) FROM PUBLIC")
    # In the style of 0010: workers configure the trigger and send the events; operators look
    # at them, requeue dead ones and purge.
    op.execute("GRANT EXECUTE ON FUNCTION notifier_status_webhook(text[]) TO notifier_worker")
    op.execute("GRANT SELECT ON status_webhook TO notifier_worker, notifier_operator")
    op.execute("GRANT SELECT, UPDATE, DELETE ON status_events TO notifier_worker")
    op.execute("GRANT SELECT, UPDATE, DELETE ON status_events TO notifier_operator")


def downgrade() -> None:
    op.execute("DROP FUNCTION notifier_status_webhook(text[])")
    op.execute("DROP TRIGGER IF EXISTS notifications_status_events ON notifications")
    op.execute("DROP FUNCTION notifier_status_events()")
    op.execute("DROP TABLE status_events")
    op.execute("DROP TABLE status_webhook")
