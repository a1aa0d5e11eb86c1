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

KEEP = """
    CREATE FUNCTION {schema}.notifier_keep_requests() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, {schema}, pg_temp
    AS $$
    BEGIN
        INSERT INTO {schema}.api_requests (dedupe_key, key_id, body_hash, notification_id)
        SELECT d.dedupe_key,
               coalesce((SELECT min(k.id) FROM {schema}.api_keys k WHERE k.name = d.producer), 0),
               d.request_hash, d.id
          FROM notifier_deleted d
         WHERE d.request_hash IS NOT NULL AND d.dedupe_key IS NOT NULL
        ON CONFLICT (dedupe_key) DO NOTHING;
        RETURN NULL;
    END
    $$
"""


def upgrade() -> None:
    schema = op.get_bind().execute(text("SELECT quote_ident(current_schema())")).scalar_one()
    op.execute("ALTER TABLE notifications ADD COLUMN request_hash bytea")
    op.execute(
        "COMMENT ON COLUMN notifications.request_hash IS 'The SHA-256 of the API request that"
        " wrote the row, its Idempotency-Key the dedupe_key; NULL for a row written otherwise.'"
    )
    op.execute("GRANT INSERT (request_hash) ON notifications TO notifier_api")
    op.execute(KEEP.format(schema=schema))
    op.execute(f"REVOKE ALL ON FUNCTION {schema}.notifier_keep_requests() FROM PUBLIC")
    op.execute(
        "CREATE TRIGGER notifications_keep_requests AFTER DELETE ON notifications"
        " REFERENCING OLD TABLE AS notifier_deleted FOR EACH STATEMENT"
        f" EXECUTE FUNCTION {schema}.notifier_keep_requests()"
    )


def downgrade() -> None:
    op.execute(
        "INSERT INTO api_requests (dedupe_key, key_id, body_hash, notification_id)"
        " SELECT n.dedupe_key,"
        " coalesce((SELECT min(k.id) FROM api_keys k WHERE k.name = n.producer), 0),"
        " n.request_hash, n.id FROM notifications n"
        " WHERE n.request_hash IS NOT NULL AND n.dedupe_key IS NOT NULL"
        " ON CONFLICT (dedupe_key) DO NOTHING"
    )
    op.execute("DROP TRIGGER notifications_keep_requests ON notifications")
    op.execute("DROP FUNCTION notifier_keep_requests()")
    op.execute("ALTER TABLE notifications DROP COLUMN request_hash")
