"""Content: templates a row may name instead of its subject and body, and the suppression list.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable and without a default: PostgreSQL adds them to a large table without rewriting it,
    # and rows written by producers that do not know them are unchanged.
    op.execute("ALTER TABLE notifications ADD COLUMN template text, ADD COLUMN locale text")
    op.execute(
        """
        CREATE TABLE templates (
            name       text NOT NULL,
            channel    text NOT NULL,
            locale     text NOT NULL,
            subject    text,
            body       text,
            html       text,
            updated_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (name, channel, locale),
            CONSTRAINT templates_has_content
                CHECK (subject IS NOT NULL OR body IS NOT NULL OR html IS NOT NULL)
        )
        """
    )
    op.execute(
        "COMMENT ON TABLE templates IS 'Jinja2 templates a notification names in its template"
        " column; written by notifier template add.'"
    )
    # Looked up once per batch by (channel, recipient) = the primary key.
    op.execute(
        """
        CREATE TABLE suppressions (
            channel    text NOT NULL,
            recipient  text NOT NULL,
            reason     text NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (channel, recipient)
        )
        """
    )
    op.execute(
        "COMMENT ON TABLE suppressions IS 'Recipients never sent to on a channel. Producers may"
        " INSERT ... ON CONFLICT DO NOTHING; notifier adds hard bounces.'"
    )


def downgrade() -> None:
    op.execute("DROP TABLE suppressions")
    op.execute("DROP TABLE templates")
    op.execute("ALTER TABLE notifications DROP COLUMN locale, DROP COLUMN template")
