"""Consent has a scope: a row's category, and what each kind of suppression covers.

``notifications.category`` is the producer's word for what a message is (``security``,
``billing``, ``marketing``; NULL: transactional), short and of ``[a-z0-9_.-]``. Campaigns
write theirs (``campaigns.category``, ``marketing`` unless named); rows of campaigns still
unsent get ``marketing``, which is what every campaign was until now.

``suppressions`` entries get a ``kind``: ``opt-out`` (the default, so producers' plain INSERTs
keep meaning what they meant), ``bounce``, ``complaint``, ``invalid`` or ``operator``. An entry
covers every category, except that a complaint spares transactional rows (category NULL).
Existing entries get the kind their reason names. ``category_opt_outs`` holds opt-outs of one
category, stored by the same ``suppression_recipient`` rule (the same trigger function); the
one-click opt-outs recorded so far came from campaigns, so they move there as ``marketing``.

Producers no longer DELETE suppressions: ``notifier_lift_opt_out(channel, recipient,
category)``, a SECURITY DEFINER function, lifts opt-outs only, never a bounce or complaint.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-12
"""

from alembic import op
from sqlalchemy import text

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

#: A category's shape, for both tables' CHECK constraints.
SHAPE = "{0} ~ '^[a-z0-9_.-]{{1,64}}$'"
KINDS = "'opt-out', 'bounce', 'complaint', 'invalid', 'operator'"

GRANTS = (
    "GRANT INSERT (category) ON notifications TO notifier_producer",
    "REVOKE DELETE ON suppressions FROM notifier_producer",
    "GRANT INSERT (kind), SELECT (kind) ON suppressions TO notifier_producer",
    "GRANT INSERT (channel, recipient, category, reason), SELECT (channel, recipient, category)"
    " ON category_opt_outs TO notifier_producer",
    "GRANT SELECT, INSERT ON category_opt_outs TO notifier_worker",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON category_opt_outs TO notifier_operator",
)

# Owned by the migrating login, which owns the tables; callers cannot steer it: names are
# schema-qualified and search_path is pinned ({schema} is this database's, quoted).
LIFT_OPT_OUT = """
    CREATE FUNCTION {schema}.notifier_lift_opt_out(
        channel text, recipient text, category text DEFAULT NULL) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, {schema}, pg_temp
    AS $$
    DECLARE
        who text := {schema}.suppression_recipient(channel, recipient);
        lifted integer := 0;
        n integer;
    BEGIN
        IF category IS NULL THEN
            DELETE FROM {schema}.suppressions AS s
             WHERE s.channel = notifier_lift_opt_out.channel AND s.recipient = who
               AND s.kind = 'opt-out';
            GET DIAGNOSTICS lifted = ROW_COUNT;
        END IF;
        DELETE FROM {schema}.category_opt_outs AS o
         WHERE o.channel = notifier_lift_opt_out.channel AND o.recipient = who
           AND (notifier_lift_opt_out.category IS NULL
                OR o.category = notifier_lift_opt_out.category);
        GET DIAGNOSTICS n = ROW_COUNT;
        RETURN lifted + n > 0;
    END
    $$
"""
SIGNATURE = "notifier_lift_opt_out(text, text, text)"


def upgrade() -> None:
    schema = op.get_bind().execute(text("SELECT quote_ident(current_schema())")).scalar_one()

    op.execute("ALTER TABLE notifications ADD COLUMN category text")
    # NOT VALID first: the ALTER then holds its lock for no scan; VALIDATE scans under a lock
    # that lets producers keep inserting.
    op.execute(
        "ALTER TABLE notifications ADD CONSTRAINT notifications_category"
        f" CHECK ({SHAPE.format('category')}) NOT VALID"
    )
    op.execute("ALTER TABLE notifications VALIDATE CONSTRAINT notifications_category")
    op.execute("ALTER TABLE campaigns ADD COLUMN category text NOT NULL DEFAULT 'marketing'")
    op.execute(
        "ALTER TABLE campaigns ADD CONSTRAINT campaigns_category"
        f" CHECK ({SHAPE.format('category')})"
    )
    op.execute(
        "UPDATE notifications SET category = 'marketing'"
        " WHERE campaign_id IS NOT NULL AND status IN ('pending', 'processing')"
    )

    op.execute("ALTER TABLE suppressions ADD COLUMN kind text NOT NULL DEFAULT 'opt-out'")
    op.execute(
        f"ALTER TABLE suppressions ADD CONSTRAINT suppressions_kind CHECK (kind IN ({KINDS}))"
    )
    op.execute(
        """
        UPDATE suppressions SET kind = CASE
                 WHEN reason LIKE 'hard bounce%' OR reason LIKE 'soft bounces%' THEN 'bounce'
                 WHEN reason LIKE 'complaint%' THEN 'complaint'
                 ELSE 'opt-out' END
        """
    )
    op.execute(
        f"""
        CREATE TABLE category_opt_outs (
            channel    text NOT NULL,
            recipient  text NOT NULL,
            category   text NOT NULL,
            reason     text NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (channel, recipient, category),
            CONSTRAINT category_opt_outs_category CHECK ({SHAPE.format("category")})
        )
        """
    )
    op.execute(
        "COMMENT ON TABLE category_opt_outs IS 'Recipients not sent rows of one category on a"
        " channel (one-click unsubscribes). Producers may INSERT ... ON CONFLICT DO NOTHING.'"
    )
    op.execute(
        "CREATE TRIGGER category_opt_outs_normalize BEFORE INSERT OR UPDATE"
        " ON category_opt_outs FOR EACH ROW EXECUTE FUNCTION suppressions_normalize()"
    )
    op.execute(
        """
        WITH moved AS (
            DELETE FROM suppressions WHERE reason LIKE 'unsubscribed (one-click, %'
            RETURNING channel, recipient, reason, created_at)
        INSERT INTO category_opt_outs (channel, recipient, category, reason, created_at)
        SELECT channel, recipient, 'marketing', reason, created_at FROM moved
        """
    )

    op.execute(LIFT_OPT_OUT.format(schema=schema))
    op.execute(f"REVOKE ALL ON FUNCTION {schema}.{SIGNATURE} FROM PUBLIC")
    op.execute(
        f"GRANT EXECUTE ON FUNCTION {schema}.{SIGNATURE} TO notifier_producer, notifier_operator"
    )
    for grant in GRANTS:
        op.execute(grant)


def downgrade() -> None:
    # Scoped opt-outs become opt-outs of everything again: nobody who opted out is mailed.
    op.execute(
        "INSERT INTO suppressions (channel, recipient, reason, created_at)"
        " SELECT DISTINCT ON (channel, recipient) channel, recipient, reason, created_at"
        "   FROM category_opt_outs ORDER BY channel, recipient, created_at"
        " ON CONFLICT (channel, recipient) DO NOTHING"
    )
    op.execute(f"DROP FUNCTION {SIGNATURE}")
    op.execute("DROP TABLE category_opt_outs")
    op.execute("ALTER TABLE suppressions DROP COLUMN kind")
    op.execute("GRANT DELETE ON suppressions TO notifier_producer")
    op.execute("ALTER TABLE campaigns DROP COLUMN category")
    op.execute("ALTER TABLE notifications DROP COLUMN category")
