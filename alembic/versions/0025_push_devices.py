"""A person's devices: a push row to a profile becomes one row per device token.

A push row that names a ``profile`` and leaves ``recipient`` empty is, once its preference,
quiet hours and frequency cap let it go, fanned out by ``notifier_fan_out``: one new row per
token of the person's ``push_tokens`` (the first 20, each once), with ``recipient`` the token,
``parent_id`` the row it came from, and the person's fields and locale folded in, so each
device has its own attempts, retries and history. The row itself ends ``sent`` with provider
``devices``, and its history says ``fanned_out`` and to how many. The unique index on
``(parent_id, recipient)`` keeps a device to one row of a parent.

The function runs as its owner (``search_path`` pinned) and only for a push row the calling
worker holds (``processing`` under its claim token): workers get no INSERT on
``notifications``, so a worker can fan out what a producer wrote and nothing else.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-16
"""

from alembic import op
from sqlalchemy import text

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

BEFORE = (
    "'sent', 'retry', 'deferred', 'dead', 'cancelled', 'rescued', 'requeued',"
    " 'delivered', 'undelivered', 'bounced', 'complained', 'held'"
)

SIGNATURE = "notifier_fan_out(bigint, uuid, text, integer)"

# Returns the row's new status, ``sent`` or ``dead``; NULL when it is not a push row to a person
# that this claim holds (nothing changed). A person with no token left, or devices' rows that
# cannot be written, make the row dead with the reason: one row never fails its batch's call.
FAN_OUT = """
    CREATE FUNCTION {schema}.notifier_fan_out(parent bigint, claim uuid, worker text,
                                              devices integer) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, {schema}, pg_temp
    AS $$
    DECLARE
        p {schema}.notifications;
        person {schema}.profiles;
        tokens text[];
        written integer;
        reason text;
    BEGIN
        SELECT * INTO p FROM {schema}.notifications
         WHERE id = parent AND status = 'processing' AND claim_token = claim
           AND channel = 'push' AND recipient = '' AND profile IS NOT NULL
           FOR UPDATE;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        SELECT * INTO person FROM {schema}.profiles WHERE id = p.profile;
        tokens := ARRAY(SELECT DISTINCT t
                          FROM unnest(person.push_tokens[1:devices]) AS t
                         WHERE t <> '' AND octet_length(t) <= 4096);
        IF cardinality(tokens) = 0 THEN
            reason := format('profile %L has no push token: add its devices to push_tokens',
                             p.profile);
        ELSE
            BEGIN  -- whatever stops the devices' rows ends this row, never its batch
                INSERT INTO {schema}.notifications
                       (channel, recipient, subject, body, payload, priority, max_attempts,
                        next_attempt_at, template, locale, category, producer, campaign_id,
                        expires_at, parent_id)
                SELECT 'push', t, p.subject, p.body,
                       CASE WHEN jsonb_typeof(person.fields) = 'object' THEN person.fields
                            ELSE '{{}}'::jsonb END || p.payload,
                       p.priority, p.max_attempts, now(), p.template,
                       coalesce(p.locale, person.locale), p.category, p.producer,
                       p.campaign_id, p.expires_at, p.id
                  FROM unnest(tokens) AS t
                ON CONFLICT DO NOTHING;
                GET DIAGNOSTICS written = ROW_COUNT;
            EXCEPTION WHEN OTHERS THEN
                reason := format('its devices'' rows could not be written (SQLSTATE %s): %s',
                                 SQLSTATE, SQLERRM);
            END;
        END IF;
        IF reason IS NOT NULL THEN
            reason := left(reason, 2000);
            UPDATE {schema}.notifications
               SET status = 'dead', updated_at = now(), locked_until = NULL,
                   last_error = reason
             WHERE id = p.id;
            INSERT INTO {schema}.notification_attempts
                   (notification_id, attempt, worker, channel, outcome, error)
            VALUES (p.id, p.attempts, worker, 'push', 'dead', reason);
            RETURN 'dead';
        END IF;
        UPDATE {schema}.notifications
           SET status = 'sent', sent_at = now(), updated_at = now(), locked_until = NULL,
               provider = 'devices', last_error = NULL
         WHERE id = p.id;
        INSERT INTO {schema}.notification_attempts
               (notification_id, attempt, worker, channel, outcome, error, provider)
        VALUES (p.id, p.attempts, worker, 'push', 'fanned_out',
                format('to %s of %s devices', written, cardinality(tokens)), 'devices');
        RETURN 'sent';
    END
    $$
"""


def _outcomes(allowed: str) -> None:
    op.execute(
        "ALTER TABLE notification_attempts DROP CONSTRAINT notification_attempts_outcome,"
        " ADD CONSTRAINT notification_attempts_outcome"
        f" CHECK (outcome IN ({allowed})) NOT VALID"
    )
    op.execute(
        "ALTER TABLE notification_attempts VALIDATE CONSTRAINT notification_attempts_outcome"
    )


def upgrade() -> None:
    schema = op.get_bind().execute(text("SELECT quote_ident(current_schema())")).scalar_one()
    op.execute("ALTER TABLE notifications ADD COLUMN parent_id bigint")
    _outcomes(f"{BEFORE}, 'fanned_out'")
    op.execute(FAN_OUT.format(schema=schema))
    op.execute(f"REVOKE ALL ON FUNCTION {schema}.{SIGNATURE} FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION {schema}.{SIGNATURE} TO notifier_worker")
    with op.get_context().autocommit_block():
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS notifications_parent_recipient")
        op.execute(
            "CREATE UNIQUE INDEX CONCURRENTLY notifications_parent_recipient"
            " ON notifications (parent_id, recipient) WHERE parent_id IS NOT NULL"
        )


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS notifications_parent_recipient")
    op.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")
    op.execute("DELETE FROM notification_attempts WHERE outcome = 'fanned_out'")
    _outcomes(BEFORE)
    op.execute("ALTER TABLE notifications DROP COLUMN parent_id")
