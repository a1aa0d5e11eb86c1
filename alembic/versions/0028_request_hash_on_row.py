"""A keyed API request's hash on the row it wrote; ``api_requests`` takes it when the row goes.

The API kept each keyed request's hash in ``api_requests``, a row and an index entry of a second
table written beside every row: of the 16.5 to 20.5 us PostgreSQL spent on a batch's row, 6 to
9. Now the row carries it (``notifications.request_hash``), and a statement trigger
(``notifications_keep_requests``) copies the key, the hash and the row's id into
``api_requests`` when the row is deleted (purged, or by hand), so that a key stays used after
its row is gone, as before. Keys written before this keep their ``api_requests`` rows; a key's
first request is found on its row or there.

Only the API writes the column (``notifier_api``'s grant); a producer login cannot name it, so
no row a producer wrote can pass for an API request. The trigger's function is a definer
(``api_requests`` is not the deleting role's to write), pinned like every other (0020); it
names the key a row was written with by the row's producer, the key's name (``api_keys``
keeps revoked keys: the first of that name, 0 should there be none).

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-04
"""

from alembic import op
from sqlalchemy import text

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

# The keys of ``rows`` that API requests wrote, each with its hash, its row and its key (the
# first of the row's producer's name), into ``api_requests``: what the trigger does for the
# rows deleted, and the downgrade for every row.
KEPT = """
    INSERT INTO {schema}.api_requests (dedupe_key, key_id, body_hash, notification_id)
    SELECT r.dedupe_key,
           coalesce((SELECT min(k.id) FROM {schema}.api_keys k WHERE k.name = r.producer), 0),
           r.request_hash, r.id
      FROM {rows} r
     WHERE r.request_hash IS NOT NULL AND r.dedupe_key IS NOT NULL
    ON CONFLICT (dedupe_key) DO NOTHING
"""

KEEP = """
    CREATE FUNCTION {schema}.notifier_keep_requests() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, {schema}, pg_temp
    AS $$
    BEGIN
        {kept};
        RETURN NULL;
    END
    $$
"""


def _schema() -> str:
    return str(op.get_bind().execute(text("SELECT quote_ident(current_schema())")).scalar_one())


def upgrade() -> None:
    schema = _schema()
    op.execute("ALTER TABLE notifications ADD COLUMN request_hash bytea")
    op.execute(
        "COMMENT ON COLUMN notifications.request_hash IS 'The SHA-256 of the API request that"
        " wrote the row, its Idempotency-Key the dedupe_key; NULL for a row written otherwise.'"
    )
    op.execute("GRANT INSERT (request_hash) ON notifications TO notifier_api")
    kept = KEPT.format(schema=schema, rows="notifier_deleted")
    op.execute(KEEP.format(schema=schema, kept=kept))
    op.execute(f"REVOKE ALL ON FUNCTION {schema}.notifier_keep_requests() FROM PUBLIC")
    op.execute(
        "CREATE TRIGGER notifications_keep_requests AFTER DELETE ON notifications"
        " REFERENCING OLD TABLE AS notifier_deleted FOR EACH STATEMENT"
        f" EXECUTE FUNCTION {schema}.notifier_keep_requests()"
    )


def downgrade() -> None:
    schema = _schema()
    op.execute(KEPT.format(schema=schema, rows=f"{schema}.notifications"))
    op.execute("DROP TRIGGER notifications_keep_requests ON notifications")
    op.execute("DROP FUNCTION notifier_keep_requests()")
    op.execute("ALTER TABLE notifications DROP COLUMN request_hash")
