"""Database roles with least privilege for producers, workers, operators and audience queries.

Four group roles (NOLOGIN); a deployment makes LOGIN users members of them (docs/roles.sql):

* ``notifier_producer``: writes notifications by the producer contract and cancels unsent ones;
  row-level security lets it change a row only from ``pending``/``processing`` to
  ``cancelled``.
* ``notifier_worker``: claims, records and rescues rows, reads templates, suppressions and
  campaign states, adds hard bounces; deletes only for retention (beat's daily purge runs on
  the workers).
* ``notifier_operator``: the ``notifier`` command's day-two work: send, requeue, cancel,
  purge, stats, campaigns, templates, suppressions; a member of ``notifier_audience``.
* ``notifier_audience``: nothing on notifier's tables. An audience ``--query`` runs as this
  role in a read-only transaction, inside ``notifier_audience_rows``, a SECURITY DEFINER
  function it owns: there PostgreSQL refuses ``SET ROLE`` and ``SET SESSION AUTHORIZATION``,
  so the query cannot climb back to the login's role. It reads what operators GRANT it.

Roles belong to the cluster and may already exist (another database, or a migration running
at the same moment): creating them tolerates both. Grants belong to this database; the
downgrade revokes them and leaves the roles, which other databases may still use.

A later migration that adds a table must grant it to the roles that use it.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-30
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

ROLES = ("notifier_producer", "notifier_worker", "notifier_operator", "notifier_audience")
TABLES = (
    "notifications",
    "notification_attempts",
    "campaigns",
    "campaign_recipients",
    "campaign_codes",
    "campaign_chunks",
    "templates",
    "suppressions",
)

# The columns of the producer contract a producer may write, and those it reads back for
# ``ON CONFLICT (dedupe_key) ... RETURNING id`` and a cancel by key or id.
PRODUCER_INSERT = (
    "channel, recipient, subject, body, payload, dedupe_key, priority, max_attempts,"
    " next_attempt_at, expires_at, guard, template, locale"
)
PRODUCER_SELECT = "id, dedupe_key, status"
PRODUCER_UPDATE = "status, last_error, updated_at, locked_until"

GRANTS = (
    f"GRANT INSERT ({PRODUCER_INSERT}), SELECT ({PRODUCER_SELECT}), UPDATE ({PRODUCER_UPDATE})"
    " ON notifications TO notifier_producer",
    "GRANT INSERT (channel, recipient, reason), SELECT (channel, recipient), DELETE"
    " ON suppressions TO notifier_producer",
    "GRANT SELECT, UPDATE, DELETE ON notifications TO notifier_worker",
    "GRANT SELECT, INSERT, DELETE ON notification_attempts TO notifier_worker",
    "GRANT SELECT ON campaigns, templates TO notifier_worker",
    "GRANT SELECT, INSERT ON suppressions TO notifier_worker",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON notifications TO notifier_operator",
    "GRANT SELECT, DELETE ON notification_attempts TO notifier_operator",
    "GRANT SELECT, INSERT, UPDATE ON campaigns TO notifier_operator",
    "GRANT SELECT, INSERT ON campaign_recipients, campaign_codes TO notifier_operator",
    "GRANT SELECT, INSERT ON campaign_chunks TO notifier_operator",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON templates, suppressions TO notifier_operator",
)

# Runs an operator's audience query as its owner, notifier_audience. SECURITY DEFINER is the
# point: within it PostgreSQL refuses to change the role (set_config('role', ...)), which a
# query could otherwise do, since the session's own user may take any role it is a member of.
AUDIENCE_ROWS = """
    CREATE FUNCTION notifier_audience_rows(query text)
    RETURNS TABLE (recipient text, fields jsonb)
    LANGUAGE plpgsql SECURITY DEFINER AS $$
    BEGIN
        RETURN QUERY EXECUTE format(
            'SELECT q.recipient::text, to_jsonb(q) - ''recipient'' FROM (%s) AS q'
            ' WHERE q.recipient IS NOT NULL', query);
    END
    $$
"""


def upgrade() -> None:
    for role in ROLES:
        # Another database's migration may create it at the same moment: the loser of that
        # race sees a unique violation rather than duplicate_object.
        op.execute(
            f"DO $$ BEGIN CREATE ROLE {role} NOLOGIN;"
            " EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
        )
    # Operators run audience queries, so their logins may take that role; another migration
    # granting the same at the same moment loses with a unique violation.
    op.execute(
        "DO $$ BEGIN GRANT notifier_audience TO notifier_operator;"
        " EXCEPTION WHEN unique_violation THEN NULL; END $$"
    )
    # The login running migrations (and the command) must be able to SET ROLE to it.
    op.execute(
        "DO $$ BEGIN IF NOT pg_has_role(current_user, 'notifier_audience', 'MEMBER') THEN"
        " EXECUTE format('GRANT notifier_audience TO %I', current_user);"
        " END IF; END $$"
    )
    for grant in GRANTS:
        op.execute(grant)
    # ANALYZE after an import needs MAINTAIN, which PostgreSQL has from 17 on; before, only
    # the owner may (the operator's ANALYZE is then skipped with a warning; autovacuum runs it).
    op.execute(
        "DO $$ BEGIN IF current_setting('server_version_num')::int >= 170000 THEN"
        " EXECUTE 'GRANT MAINTAIN ON campaign_recipients, campaign_codes TO notifier_operator';"
        " END IF; END $$"
    )
    # Before PostgreSQL 15 every role may create objects in public, audience included: a
    # function or trigger it made could outlive its query. Nothing of notifier needs that.
    op.execute(
        "DO $$ BEGIN IF has_schema_privilege('public', 'public', 'CREATE') THEN"
        " REVOKE CREATE ON SCHEMA public FROM PUBLIC; END IF; END $$"
    )
    # A producer changes a row only from pending or processing to cancelled; everyone else
    # whose grants allow a statement may run it on any row.
    op.execute("ALTER TABLE notifications ENABLE ROW LEVEL SECURITY")
    op.execute("CREATE POLICY notifications_granted ON notifications USING (true)")
    op.execute(
        "CREATE POLICY notifications_producer_cancels ON notifications AS RESTRICTIVE"
        " FOR UPDATE TO notifier_producer"
        " USING (status IN ('pending', 'processing')) WITH CHECK (status = 'cancelled')"
    )
    op.execute(AUDIENCE_ROWS)
    op.execute("REVOKE ALL ON FUNCTION notifier_audience_rows(text) FROM PUBLIC")
    # Changing the owner needs the new owner to be allowed to create it; that lasts only
    # within this transaction.
    op.execute("GRANT CREATE ON SCHEMA public TO notifier_audience")
    op.execute("ALTER FUNCTION notifier_audience_rows(text) OWNER TO notifier_audience")
    op.execute("REVOKE CREATE ON SCHEMA public FROM notifier_audience")


def downgrade() -> None:
    op.execute("DROP FUNCTION notifier_audience_rows(text)")
    op.execute("DROP POLICY notifications_producer_cancels ON notifications")
    op.execute("DROP POLICY notifications_granted ON notifications")
    op.execute("ALTER TABLE notifications DISABLE ROW LEVEL SECURITY")
    roles = ", ".join(ROLES)
    op.execute(f"REVOKE ALL ON {', '.join(TABLES)} FROM {roles}")
