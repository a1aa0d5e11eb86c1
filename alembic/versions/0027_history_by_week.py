"""The attempt history by week: a table partitioned on ``at``, its old weeks dropped whole.

``notification_attempts`` grows by a row per attempt, and the purge deleted a finished row's
history with the row, row by row: at tens of millions of rows that is the purge's whole cost,
and every deleted row is dead space for autovacuum to reclaim. Now the history is a table
partitioned by range of ``at``, one partition a week (``notification_attempts_wYYYYMMDD``, the
Monday it starts, in UTC), and the weeks entirely older than ``NOTIFIER_RETENTION_HISTORY_DAYS``
are detached and dropped whole (``notifier_history_weeks``); the purge no longer touches the
history. A row's history is kept for that long whatever the row's own retention.

The history written so far becomes one partition, ``notification_attempts_before``, for every
time before next Monday: nothing is copied, but attaching it reads it once to check its rows
fit, and its lookup index ``(notification_id, id)`` is built again (partitioned tables carry no
primary key that leaves out the partition column, so the index is a plain one). A default
partition catches an attempt no week was made for (made weeks ahead, daily: it stays empty);
a week made later takes that week's rows out of it.

PostgreSQL 15 has no identity column on a partitioned table: ``id`` comes from a sequence of
the same name, carried on from where the identity was, and every role that inserts history is
granted its use. Grants on the table are carried over as they were.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-02
"""

from alembic import op
from sqlalchemy import text

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

SIGNATURE = "notifier_history_weeks(integer, integer, boolean, timestamptz, integer)"

# Weeks made ahead, and weeks past ``keep_days`` detached and dropped; the default partition's
# rows past it deleted. A lock the drop cannot have within two seconds (a long read of the
# history) leaves that week for the next run rather than queueing every insert behind it.
# ``at`` is the time it acts as of (``now()`` when NULL): a test's way to let weeks pass.
# ``drops`` is the most weeks one call drops (all when NULL): a detached week holds the history
# against every writer until its transaction ends, so the purge drops one week a transaction,
# counting its attempts before it takes the lock.
WEEKS = """
    CREATE FUNCTION {schema}.notifier_history_weeks(weeks_ahead integer, keep_days integer,
                                                    dry_run boolean, at timestamptz,
                                                    drops integer)
    RETURNS TABLE (week text, action text, attempts bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, {schema}, pg_temp
    AS $$
    DECLARE
        cutoff timestamptz := coalesce(at, now()) - make_interval(days => keep_days);
        this_week timestamptz :=
            date_trunc('week', coalesce(at, now()) AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
        covered timestamptz;
        starts timestamptz;
        part record;
        n bigint;
        dropped integer := 0;
        stuck boolean := false;
    BEGIN
        IF weeks_ahead IS NULL OR weeks_ahead NOT BETWEEN 1 AND 52 THEN
            RAISE EXCEPTION 'weeks_ahead must be 1 to 52, not %', weeks_ahead;
        END IF;
        IF keep_days IS NULL OR keep_days < 1 THEN
            RAISE EXCEPTION 'keep_days must be at least 1, not %', keep_days;
        END IF;
        IF NOT dry_run THEN  -- for this transaction: the caller's own
            PERFORM set_config('lock_timeout', '2s', true);
        END IF;
        FOR part IN
            SELECT c.relname,
                   substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \\(''([^'']+)''\\)')
                       ::timestamptz AS ends
              FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = '{schema}.notification_attempts'::regclass
             ORDER BY 2
        LOOP
            CONTINUE WHEN part.ends IS NULL OR part.ends > cutoff;  -- the default, or kept
            EXIT WHEN NOT dry_run AND dropped >= coalesce(drops, 2147483647);
            EXECUTE format('SELECT count(*) FROM {schema}.%I', part.relname) INTO n;
            week := part.relname; action := 'dropped'; attempts := n;
            IF stuck THEN  -- the history is in use: every week waits for the same lock
                action := 'busy';
            ELSIF NOT dry_run THEN
                BEGIN
                    EXECUTE format('ALTER TABLE {schema}.notification_attempts'
                                   ' DETACH PARTITION {schema}.%I', part.relname);
                    EXECUTE format('DROP TABLE {schema}.%I', part.relname);
                    dropped := dropped + 1;
                EXCEPTION WHEN lock_not_available THEN
                    action := 'busy';
                    stuck := true;
                END;
            END IF;
            RETURN NEXT;
        END LOOP;
        IF dry_run THEN
            SELECT count(*) INTO n FROM {schema}.notification_attempts_default d
             WHERE d.at < cutoff;
        ELSE
            DELETE FROM {schema}.notification_attempts_default d WHERE d.at < cutoff;
            GET DIAGNOSTICS n = ROW_COUNT;
        END IF;
        IF n > 0 THEN
            week := 'notification_attempts_default'; action := 'deleted'; attempts := n;
            RETURN NEXT;
        END IF;
        SELECT max(substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \\(''([^'']+)''\\)')
                       ::timestamptz)
          INTO covered
          FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = '{schema}.notification_attempts'::regclass;
        starts := greatest(coalesce(covered, this_week), this_week);
        WHILE starts < this_week + make_interval(weeks => weeks_ahead + 1) LOOP
            week := 'notification_attempts_w' || to_char(starts AT TIME ZONE 'UTC', 'YYYYMMDD');
            action := 'made';
            SELECT count(*) INTO attempts FROM {schema}.notification_attempts_default d
             WHERE d.at >= starts AND d.at < starts + interval '7 days';
            IF stuck THEN
                action := 'busy';
            ELSIF NOT dry_run THEN
                BEGIN
                    EXECUTE format('CREATE TABLE {schema}.%I (LIKE {schema}.notification_attempts'
                                   ' INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', week);
                    EXECUTE format('WITH moved AS (DELETE FROM'
                                   ' {schema}.notification_attempts_default d'
                                   ' WHERE d.at >= %L AND d.at < %L RETURNING d.*)'
                                   ' INSERT INTO {schema}.%I SELECT * FROM moved',
                                   starts, starts + interval '7 days', week);
                    EXECUTE format('ALTER TABLE {schema}.notification_attempts ATTACH PARTITION'
                                   ' {schema}.%I FOR VALUES FROM (%L) TO (%L)',
                                   week, starts, starts + interval '7 days');
                EXCEPTION WHEN lock_not_available THEN  -- made on a later day, weeks ahead
                    action := 'busy';
                    stuck := true;
                END;
            END IF;
            RETURN NEXT;
            starts := starts + interval '7 days';
        END LOOP;
    END
    $$
"""

# The table's grants as they are, for the table that takes its place (and, for those who
# insert, the sequence its ids now come from).
CARRY_GRANTS = """
    DO $$
    DECLARE g record;
    BEGIN
        FOR g IN
            SELECT a.privilege_type, r.rolname
              FROM pg_class c, aclexplode(c.relacl) a JOIN pg_roles r ON r.oid = a.grantee
             WHERE c.oid = '{source}'::regclass AND r.rolname <> current_user
        LOOP
            EXECUTE format('GRANT %s ON {target} TO %I', g.privilege_type, g.rolname);
            IF g.privilege_type = 'INSERT' THEN
                EXECUTE format('GRANT USAGE ON SEQUENCE notification_attempts_id_seq TO %I',
                               g.rolname);
            END IF;
        END LOOP;
    END $$
"""

NEXT_MONDAY = "date_trunc('week', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' + interval '7 days'"


def upgrade() -> None:
    schema = op.get_bind().execute(text("SELECT quote_ident(current_schema())")).scalar_one()
    # The identity's position, carried to a sequence of the same name.
    op.execute(
        """
        DO $$
        DECLARE v bigint; called boolean;
        BEGIN
            SELECT last_value, is_called INTO v, called FROM notification_attempts_id_seq;
            ALTER TABLE notification_attempts ALTER COLUMN id DROP IDENTITY;
            CREATE SEQUENCE notification_attempts_id_seq AS bigint;
            PERFORM setval('notification_attempts_id_seq', v, called);
        END $$
        """
    )
    op.execute("ALTER TABLE notification_attempts RENAME TO notification_attempts_before")
    op.execute("ALTER INDEX notification_attempts_at RENAME TO notification_attempts_before_at")
    op.execute(
        "ALTER TABLE notification_attempts_before"
        " RENAME CONSTRAINT notification_attempts_pkey TO notification_attempts_before_pkey"
    )
    op.execute(
        "CREATE TABLE notification_attempts (LIKE notification_attempts_before"
        " INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (at)"
    )
    op.execute(
        "ALTER TABLE notification_attempts"
        " ALTER COLUMN id SET DEFAULT nextval('notification_attempts_id_seq')"
    )
    op.execute("ALTER SEQUENCE notification_attempts_id_seq OWNED BY notification_attempts.id")
    op.execute(
        "CREATE INDEX notification_attempts_by_notification"
        " ON notification_attempts (notification_id, id)"
    )
    op.execute(
        "CREATE INDEX notification_attempts_at ON notification_attempts USING brin (at)"
        " WITH (autosummarize = on)"
    )
    bound = op.get_bind().execute(text(f"SELECT {NEXT_MONDAY}")).scalar_one()
    op.execute(  # a timestamp this migration computed, not a value from any row
        "ALTER TABLE notification_attempts ATTACH PARTITION notification_attempts_before"
        f" FOR VALUES FROM (MINVALUE) TO ('{bound.isoformat()}')"
    )
    # Its own primary key is the same B-tree as the index built for it as a partition.
    op.execute(
        "ALTER TABLE notification_attempts_before DROP CONSTRAINT notification_attempts_before_pkey"
    )
    op.execute(
        "CREATE TABLE notification_attempts_default PARTITION OF notification_attempts DEFAULT"
    )
    op.execute(
        CARRY_GRANTS.format(source="notification_attempts_before", target="notification_attempts")
    )
    op.execute(WEEKS.format(schema=schema))
    op.execute(f"REVOKE ALL ON FUNCTION {schema}.{SIGNATURE} FROM PUBLIC")
    op.execute(
        f"GRANT EXECUTE ON FUNCTION {schema}.{SIGNATURE} TO notifier_worker, notifier_operator"
    )
    op.execute(f"SELECT count(*) FROM {schema}.notifier_history_weeks(8, 36500, false, NULL, NULL)")


def downgrade() -> None:
    op.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")
    op.execute(
        "CREATE TABLE notification_attempts_flat (LIKE notification_attempts"
        " INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
    )
    op.execute("INSERT INTO notification_attempts_flat SELECT * FROM notification_attempts")
    op.execute(
        CARRY_GRANTS.format(source="notification_attempts", target="notification_attempts_flat")
    )
    op.execute(
        """
        DO $$
        DECLARE v bigint; called boolean;
        BEGIN
            SELECT last_value, is_called INTO v, called FROM notification_attempts_id_seq;
            ALTER TABLE notification_attempts_flat ALTER COLUMN id DROP DEFAULT;
            DROP TABLE notification_attempts;
            ALTER TABLE notification_attempts_flat RENAME TO notification_attempts;
            ALTER TABLE notification_attempts
                ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY;
            PERFORM setval(pg_get_serial_sequence('notification_attempts', 'id'), v, called);
        END $$
        """
    )
    op.execute(
        "ALTER TABLE notification_attempts"
        " ADD CONSTRAINT notification_attempts_pkey PRIMARY KEY (notification_id, id)"
    )
    op.execute(
        "CREATE INDEX notification_attempts_at ON notification_attempts USING brin (at)"
        " WITH (autosummarize = on)"
    )
