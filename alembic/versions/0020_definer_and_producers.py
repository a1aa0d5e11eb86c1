"""Definer functions that callers cannot steer, and rows that carry their producer.

Every SECURITY DEFINER function runs with ``SET search_path = pg_catalog, <schema>, pg_temp``
and names its tables with their schema. Before, ``notifier_status_events()`` ran as the
migrating superuser with the search_path of whoever fired the trigger: a producer that owns a
schema could put an ``OPERATOR =(text, text)`` of its own there, first on its path, cancel a
row, and have its operator run as the superuser. ``notifier_audience_rows`` and
``notifier_status_webhook`` are pinned the same way; an audience query still finds the tables
of the migrated schema by their plain names.

``notifications.producer`` says who wrote a row: the session's ``notifier.producer``, which a
producer login's administrator sets for it (``ALTER ROLE billing_service SET notifier.producer =
'billing'``), or else the login's name. A producer cannot name the column (no grant), and an
INSERT by a producer login whose rows carry another name than its own (``notifier_producer()``:
its role setting, else its name), as after ``SET notifier.producer = 'shipping'``, is refused
by a statement trigger, once per statement: a default that checked each row cost 10 us a row
(1 s more for a 100,000-row INSERT ... SELECT, as a campaign launch writes). A login cannot
change its own role settings for ``notifier.*`` (PostgreSQL allows that to superusers, or to
whom it was granted with ``GRANT SET ON PARAMETER``). Producers cancel only their own rows, and
the rows written before this revision (``producer`` NULL), as any producer could before.

``dedupe_key`` is at most 1,000 bytes (``notifications_dedupe_key_length``): a longer key made
the producer's INSERT fail with ``index row requires 11464 bytes``. If existing rows hold a
longer key the migration stops and says how to find them; none is changed.

Additive and cheap on a big table: a nullable column (no rewrite; the default is set
afterwards and applies to new rows only), and the CHECK is added ``NOT VALID`` and validated in
a transaction of its own, under a lock that lets writers go on.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-11
"""

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

#: The bound on ``dedupe_key``, in bytes (README "Producer contract"; ``notifier.enqueue``).
DEDUPE_KEY_BYTES = 1000

PIN = "SET search_path = pg_catalog, {schema}, pg_temp"

# As in 0010, pinned: the operator's query sees the migrated schema's tables by plain names.
AUDIENCE_ROWS = f"""
    CREATE OR REPLACE FUNCTION {{schema}}.notifier_audience_rows(query text)
    RETURNS TABLE (recipient text, fields jsonb)
    LANGUAGE plpgsql SECURITY DEFINER {PIN} AS $$
    BEGIN
        RETURN QUERY EXECUTE pg_catalog.format(
            'SELECT q.recipient::pg_catalog.text,'
            ' pg_catalog.to_jsonb(q) OPERATOR(pg_catalog.-) ''recipient'' FROM (%s) AS q'
            ' WHERE q.recipient IS NOT NULL', query);
    END
    $$
"""

# As in 0018, pinned. The SET clause costs a change of search_path per statement that fires
# the trigger: 5 to 10 us on a single-row UPDATE that costs 270 to 300 us with the trigger on,
# nothing measurable on a drain, whose outcome writes are one statement per group of rows.
EVENTS = f"""
    CREATE OR REPLACE FUNCTION {{schema}}.notifier_status_events() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER {PIN}
    AS $$
    BEGIN
        IF NOT EXISTS (SELECT 1 FROM notifier_new
                        WHERE status = ANY (TG_ARGV) OR delivery_status = ANY (TG_ARGV)) THEN
            RETURN NULL;
        END IF;
        EXECUTE $q$
            INSERT INTO {{schema}}.status_events
                   (notification_id, kind, state, channel, dedupe_key, detail, occurred_at)
            SELECT n.id, 'status', n.status, n.channel, n.dedupe_key, n.last_error,
                   coalesce(n.sent_at, pg_catalog.now())
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

STATUSES = ("sent", "dead", "cancelled")
DELIVERY = ("delivered", "undelivered", "bounced", "complained")
KNOWN = ", ".join(f"'{s}'" for s in STATUSES + DELIVERY)

TRIGGER = (
    "CREATE OR REPLACE TRIGGER notifications_status_events AFTER UPDATE ON {schema}.notifications"
    " REFERENCING OLD TABLE AS notifier_old NEW TABLE AS notifier_new"
    " FOR EACH STATEMENT EXECUTE FUNCTION {schema}.notifier_status_events(%s)"
)

# As in 0018, with pg_catalog first and every table named with its schema.
CONFIGURE = f"""
    CREATE OR REPLACE FUNCTION {{schema}}.notifier_status_webhook(events text[]) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER {PIN}
    AS $$
    DECLARE
        wanted text[] := ARRAY(SELECT DISTINCT e FROM pg_catalog.unnest(events) AS e ORDER BY e);
        enabled boolean;
        current text[];
    BEGIN
        IF EXISTS (SELECT 1 FROM pg_catalog.unnest(wanted) AS e WHERE e NOT IN ({KNOWN})) THEN
            RAISE EXCEPTION 'unknown status webhook events in %; known: %',
                events, '{", ".join(STATUSES + DELIVERY)}'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        enabled := EXISTS (SELECT 1 FROM pg_catalog.pg_trigger
                            WHERE tgrelid = '{{schema}}.notifications'::pg_catalog.regclass
                              AND tgname = 'notifications_status_events');
        SELECT s.events INTO current FROM {{schema}}.status_webhook s;
        IF enabled = (pg_catalog.cardinality(wanted) > 0)
           AND current IS NOT DISTINCT FROM
               (CASE WHEN pg_catalog.cardinality(wanted) > 0 THEN wanted END)
        THEN
            RETURN false;
        END IF;
        SET LOCAL lock_timeout = '2s';
        IF pg_catalog.cardinality(wanted) = 0 THEN
            DELETE FROM {{schema}}.status_webhook;
            DROP TRIGGER IF EXISTS notifications_status_events ON {{schema}}.notifications;
            RETURN true;
        END IF;
        INSERT INTO {{schema}}.status_webhook (events) VALUES (wanted)
            ON CONFLICT (only_row) DO UPDATE SET events = EXCLUDED.events, updated_at = now();
        EXECUTE pg_catalog.format('{TRIGGER}', (SELECT pg_catalog.string_agg(
            pg_catalog.quote_literal(e), ', ') FROM pg_catalog.unnest(wanted) AS e));
        RETURN true;
    END
    $$
"""

# Refuses a session that says it is another producer; the name is shown as JSON, one line.
PRODUCER_REFUSED = """
    CREATE OR REPLACE FUNCTION {schema}.notifier_producer_refused(wanted text, own text)
    RETURNS text LANGUAGE plpgsql STABLE AS $$
    BEGIN
        RAISE EXCEPTION 'notifier.producer is %, but this login writes as %: unset it, or have'
            ' an administrator ALTER ROLE ... SET notifier.producer', pg_catalog.to_json(wanted),
            pg_catalog.to_json(own) USING ERRCODE = 'insufficient_privilege';
    END
    $$
"""

# A login's own producer name: its notifier.producer role setting (in this database, else in
# all), else its name; the session's notifier.producer must be unset or agree. A SQL-standard
# body: its names are bound now, not by the caller's search_path.
PRODUCER = """
    CREATE OR REPLACE FUNCTION {schema}.notifier_producer() RETURNS text
    LANGUAGE sql STABLE PARALLEL SAFE
    BEGIN ATOMIC
        SELECT CASE WHEN s.wanted IS NULL OR s.wanted = s.own THEN s.own
                    ELSE {schema}.notifier_producer_refused(s.wanted, s.own) END
          FROM (SELECT nullif(current_setting('notifier.producer', true), '') AS wanted,
                       coalesce((SELECT nullif(substr(c, 19), '')
                                   FROM pg_catalog.pg_db_role_setting AS d
                                  CROSS JOIN unnest(d.setconfig) AS c
                                  WHERE d.setrole = (SELECT r.oid FROM pg_catalog.pg_roles AS r
                                                      WHERE r.rolname = session_user)
                                    AND d.setdatabase IN (0, (SELECT b.oid
                                                                FROM pg_catalog.pg_database AS b
                                                               WHERE b.datname
                                                                     = current_database()))
                                    AND starts_with(c, 'notifier.producer=')
                                  ORDER BY d.setdatabase DESC
                                  LIMIT 1),
                                session_user) AS own) AS s;
    END
"""

# The column's default: what the session says, checked by the trigger below for producers.
DEFAULT = "coalesce(nullif(current_setting('notifier.producer', true), ''), session_user)"

# Once per INSERT statement of a producer login (not a superuser): every new row must carry its
# own name. Pinned like a definer function, though it runs as the caller: a producer's own
# operators must not decide the comparison.
NAMED = """
    CREATE OR REPLACE FUNCTION {schema}.notifier_producer_named() RETURNS trigger
    LANGUAGE plpgsql SET search_path = pg_catalog, {schema}, pg_temp AS $$
    DECLARE
        own text;
    BEGIN
        IF NOT pg_has_role(session_user, 'notifier_producer', 'MEMBER')
           OR (SELECT r.rolsuper FROM pg_roles AS r WHERE r.rolname = session_user) THEN
            RETURN NULL;
        END IF;
        own := {schema}.notifier_producer();
        IF EXISTS (SELECT 1 FROM notifier_inserted WHERE producer IS DISTINCT FROM own) THEN
            RAISE EXCEPTION 'a new row''s producer is not %, this login''s name: leave'
                ' notifier.producer as its administrator set it', to_json(own)
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        RETURN NULL;
    END
    $$
"""

CANCELS_BEFORE = "status IN ('pending', 'processing')"
CANCELS = (
    "status IN ('pending', 'processing')"
    " AND (producer IS NULL OR producer = (SELECT {schema}.notifier_producer()))"
)

TOO_LONG = f"""
    DO $$
    DECLARE
        found bigint := (SELECT count(*) FROM notifications
                          WHERE octet_length(dedupe_key) > {DEDUPE_KEY_BYTES});
    BEGIN
        IF found > 0 THEN
            RAISE EXCEPTION '% notifications have a dedupe_key over {DEDUPE_KEY_BYTES} bytes'
                ' (SELECT id FROM notifications WHERE octet_length(dedupe_key) >'
                ' {DEDUPE_KEY_BYTES}): shorten or clear those keys, then migrate again', found;
        END IF;
    END
    $$
"""


def upgrade() -> None:
    schema = op.get_bind().exec_driver_sql("SELECT quote_ident(current_schema())").scalar()
    op.execute(AUDIENCE_ROWS.format(schema=schema))
    op.execute(EVENTS.format(schema=schema))
    op.execute(CONFIGURE.format(schema=schema))
    op.execute(PRODUCER_REFUSED.format(schema=schema))
    op.execute(PRODUCER.format(schema=schema))
    op.execute(NAMED.format(schema=schema))
    op.execute("ALTER TABLE notifications ADD COLUMN IF NOT EXISTS producer text")
    op.execute(f"ALTER TABLE notifications ALTER COLUMN producer SET DEFAULT {DEFAULT}")
    op.execute(
        "COMMENT ON COLUMN notifications.producer IS 'Who wrote the row: the login''s"
        " notifier.producer, or its name; NULL for rows written before revision 0020.'"
    )
    op.execute(
        "CREATE OR REPLACE TRIGGER notifications_producer_named AFTER INSERT ON notifications"
        " REFERENCING NEW TABLE AS notifier_inserted"
        f" FOR EACH STATEMENT EXECUTE FUNCTION {schema}.notifier_producer_named()"
    )
    op.execute(
        "ALTER POLICY notifications_producer_cancels ON notifications"
        f" USING ({CANCELS.format(schema=schema)})"
    )
    op.execute(TOO_LONG)
    op.execute(
        "ALTER TABLE notifications DROP CONSTRAINT IF EXISTS notifications_dedupe_key_length,"
        " ADD CONSTRAINT notifications_dedupe_key_length"
        f" CHECK (octet_length(dedupe_key) <= {DEDUPE_KEY_BYTES}) NOT VALID"
    )
    # VALIDATE reads the whole table under SHARE UPDATE EXCLUSIVE, which lets producers and
    # workers write; in the transaction above it would be held with ADD's ACCESS EXCLUSIVE.
    with op.get_context().autocommit_block():
        op.execute("ALTER TABLE notifications VALIDATE CONSTRAINT notifications_dedupe_key_length")


def downgrade() -> None:
    # The definer functions keep their pinned search_path: they behave as 0019's did, and
    # unpinning them would open the hole again.
    op.execute("ALTER TABLE notifications DROP CONSTRAINT notifications_dedupe_key_length")
    op.execute(
        f"ALTER POLICY notifications_producer_cancels ON notifications USING ({CANCELS_BEFORE})"
    )
    op.execute("DROP TRIGGER notifications_producer_named ON notifications")
    op.execute("DROP FUNCTION notifier_producer_named()")
    op.execute("ALTER TABLE notifications DROP COLUMN producer")
    op.execute("DROP FUNCTION notifier_producer()")
    op.execute("DROP FUNCTION notifier_producer_refused(text, text)")
