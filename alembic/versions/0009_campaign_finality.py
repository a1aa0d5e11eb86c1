"""Campaign cancel and purge are final; suppression compares addresses case-insensitively.

``campaign_chunks`` records the position ranges launches have written, one row per chunk in the
chunk's transaction. It outlives ``notifier purge``, so a launch never writes a recorded position
again. Campaigns launched before this revision get one range: up to their last recipient with a
notification (a campaign still ``launching`` gets none; re-running its launch finds its rows by
the unique index, as before).

``suppression_recipient(channel, recipient)`` is the one rule by which suppression entries are
stored and looked up: an email address without surrounding whitespace, in lower case (domain
and local part: every major mailbox provider treats the local part case-insensitively); every
other channel's recipient exactly as written (an SMS number is E.164 already, or refused). A
trigger applies it to every entry written, producers' plain INSERTs included. Existing email
entries are lowercased; entries that then coincide are merged, keeping the oldest (its reason
and time).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE campaign_chunks (
            campaign_id     bigint NOT NULL,
            first_position  bigint NOT NULL,
            last_position   bigint NOT NULL,
            written         bigint NOT NULL,
            at              timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (campaign_id, first_position),
            CONSTRAINT campaign_chunks_range
                CHECK (first_position >= 1 AND last_position >= first_position)
        )
        """
    )
    op.execute(
        """
        INSERT INTO campaign_chunks (campaign_id, first_position, last_position, written)
        SELECT c.id, 1, max(r.position), count(*)
          FROM campaigns AS c
          JOIN campaign_recipients AS r ON r.campaign_id = c.id
          JOIN notifications AS n ON n.campaign_id = r.campaign_id AND n.recipient = r.recipient
         WHERE c.status IN ('running', 'paused', 'cancelled')
         GROUP BY c.id
        """
    )

    # A plain SQL function, so the planner inlines it into the lookups' index probes.
    op.execute(
        r"""
        CREATE FUNCTION suppression_recipient(channel text, recipient text) RETURNS text
        LANGUAGE sql IMMUTABLE PARALLEL SAFE
        AS $$
            SELECT CASE WHEN channel = 'email' THEN lower(btrim(recipient, E' \t\r\n'))
                        ELSE recipient END
        $$
        """
    )
    op.execute(
        """
        DELETE FROM suppressions AS s USING suppressions AS t
         WHERE s.channel = 'email' AND t.channel = 'email'
           AND suppression_recipient(s.channel, s.recipient)
               = suppression_recipient(t.channel, t.recipient)
           AND (t.created_at, t.recipient) < (s.created_at, s.recipient)
        """
    )
    op.execute(
        """
        UPDATE suppressions SET recipient = suppression_recipient(channel, recipient)
         WHERE recipient <> suppression_recipient(channel, recipient)
        """
    )
    op.execute(
        """
        CREATE FUNCTION suppressions_normalize() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            NEW.recipient := suppression_recipient(NEW.channel, NEW.recipient);
            RETURN NEW;
        END
        $$
        """
    )
    op.execute(
        "CREATE TRIGGER suppressions_normalize BEFORE INSERT OR UPDATE ON suppressions"
        " FOR EACH ROW EXECUTE FUNCTION suppressions_normalize()"
    )


def downgrade() -> None:
    # Email entries stay in lower case, and merged ones stay merged: both still work.
    op.execute("DROP TRIGGER suppressions_normalize ON suppressions")
    op.execute("DROP FUNCTION suppressions_normalize()")
    op.execute("DROP FUNCTION suppression_recipient(text, text)")
    op.execute("DROP TABLE campaign_chunks")
