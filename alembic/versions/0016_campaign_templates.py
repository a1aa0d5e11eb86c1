"""A campaign may name a stored template instead of carrying a subject and body.

``campaigns.template`` (and ``locale``) name a template of ``notifier template add``: a launch
writes each row with that template and locale and the recipient's fields in its payload, and the
worker renders it at send time like any templated row. A campaign has one or the other, never
both, by constraint; a locale only with a template.

The downgrade drops both columns. Rows already written keep their template and are rendered as
before; a templated campaign not launched yet would launch with neither subject nor body, so
launch those first (or create them again after the downgrade).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE campaigns ADD COLUMN template text, ADD COLUMN locale text")
    op.execute(
        "ALTER TABLE campaigns ADD CONSTRAINT campaigns_template_or_text"
        " CHECK (template IS NULL OR (subject IS NULL AND body IS NULL)),"
        " ADD CONSTRAINT campaigns_locale_with_template"
        " CHECK (locale IS NULL OR template IS NOT NULL)"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE campaigns DROP COLUMN locale, DROP COLUMN template")
