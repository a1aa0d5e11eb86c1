"""Campaign codes paired with recipients by position, not by an update per code.

Every recipient and every code of a campaign gets a dense position (1, 2, 3, ... in the order
they were imported); recipient N is given code N. The pairing is fixed the moment both exist, so
a launch only reads it: no write per code, nothing to reserve, and no re-run can pair anyone
differently. Positions are unique per campaign, codes are unique per campaign, so a code goes to
one recipient and a recipient gets one code, by constraint as before.

Existing pairs are kept: a code already given keeps its recipient's position; free codes fill
the positions of recipients still without one, then follow the last recipient.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE campaign_recipients ADD COLUMN position bigint")
    op.execute(
        """
        UPDATE campaign_recipients AS r SET position = s.n
          FROM (SELECT campaign_id, recipient,
                       row_number() OVER (PARTITION BY campaign_id ORDER BY recipient) AS n
                  FROM campaign_recipients) AS s
         WHERE r.campaign_id = s.campaign_id AND r.recipient = s.recipient
        """
    )
    op.execute("ALTER TABLE campaign_recipients ALTER COLUMN position SET NOT NULL")
    op.execute(
        "ALTER TABLE campaign_recipients ADD CONSTRAINT campaign_recipients_position"
        " UNIQUE (campaign_id, position)"
    )

    op.execute("ALTER TABLE campaign_codes ADD COLUMN position bigint")
    op.execute(
        """
        UPDATE campaign_codes AS k SET position = r.position
          FROM campaign_recipients AS r
         WHERE r.campaign_id = k.campaign_id AND r.recipient = k.recipient
        """
    )
    op.execute(
        """
        WITH holes AS (
                SELECT r.campaign_id, r.position,
                       row_number() OVER (PARTITION BY r.campaign_id ORDER BY r.position) AS rank
                  FROM campaign_recipients AS r
                 WHERE NOT EXISTS (SELECT 1 FROM campaign_codes AS k
                                    WHERE k.campaign_id = r.campaign_id
                                      AND k.recipient = r.recipient)),
             hole_count AS (SELECT campaign_id, count(*) AS n FROM holes GROUP BY campaign_id),
             last AS (SELECT campaign_id, max(position) AS position
                        FROM campaign_recipients GROUP BY campaign_id),
             free AS (
                SELECT campaign_id, code,
                       row_number() OVER (PARTITION BY campaign_id ORDER BY code) AS rank
                  FROM campaign_codes WHERE recipient IS NULL)
        UPDATE campaign_codes AS k
           SET position = coalesce(h.position,
                                   coalesce(l.position, 0) + f.rank - coalesce(c.n, 0))
          FROM free AS f
          LEFT JOIN holes AS h ON h.campaign_id = f.campaign_id AND h.rank = f.rank
          LEFT JOIN hole_count AS c ON c.campaign_id = f.campaign_id
          LEFT JOIN last AS l ON l.campaign_id = f.campaign_id
         WHERE k.campaign_id = f.campaign_id AND k.code = f.code
        """
    )
    op.execute("ALTER TABLE campaign_codes ALTER COLUMN position SET NOT NULL")
    op.execute(
        "ALTER TABLE campaign_codes ADD CONSTRAINT campaign_codes_position"
        " UNIQUE (campaign_id, position)"
    )
    op.execute("DROP INDEX campaign_codes_free")
    op.execute("ALTER TABLE campaign_codes DROP CONSTRAINT campaign_codes_one_per_recipient")
    op.execute("ALTER TABLE campaign_codes DROP COLUMN recipient")


def downgrade() -> None:
    op.execute("ALTER TABLE campaign_codes ADD COLUMN recipient text")
    # Codes count as given once their recipient has a notification.
    op.execute(
        """
        UPDATE campaign_codes AS k SET recipient = r.recipient
          FROM campaign_recipients AS r
         WHERE r.campaign_id = k.campaign_id AND r.position = k.position
           AND EXISTS (SELECT 1 FROM notifications AS n
                        WHERE n.campaign_id = r.campaign_id AND n.recipient = r.recipient)
        """
    )
    op.execute(
        "ALTER TABLE campaign_codes ADD CONSTRAINT campaign_codes_one_per_recipient"
        " UNIQUE (campaign_id, recipient)"
    )
    op.execute(
        "CREATE INDEX campaign_codes_free ON campaign_codes (campaign_id, code)"
        " WHERE recipient IS NULL"
    )
    op.execute("ALTER TABLE campaign_codes DROP COLUMN position")
    op.execute("ALTER TABLE campaign_recipients DROP COLUMN position")
