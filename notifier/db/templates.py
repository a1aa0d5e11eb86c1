"""The SQL of templates: what the dispatcher and campaigns look up, and what operators write.

Part of ``notifier.db``, the package that talks to the driver; ``notifier.delivery.prepare``
sees none of it. The dispatcher's lookup takes a whole batch at once (its keys probed in the
primary key), so a batch costs one statement, never one per row.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, text

from notifier.db.sql import columns

TEMPLATES_OF = text(
    """
    SELECT t.name, t.channel, t.locale, t.subject, t.body, t.html, t.updated_at
      FROM templates t
      JOIN unnest(CAST(:names AS text[]), CAST(:channels AS text[])) AS v(name, channel)
           ON t.name = v.name AND t.channel = v.channel
    """
)

# xmax is 0 for a row this statement inserted, and set for one it updated.
UPSERT_TEMPLATE = text(
    """
    INSERT INTO templates (name, channel, locale, subject, body, html)
    VALUES (:name, :channel, :locale, :subject, :body, :html)
    ON CONFLICT (name, channel, locale) DO UPDATE
       SET subject = excluded.subject, body = excluded.body, html = excluded.html,
           updated_at = now()
    RETURNING xmax = 0
    """
)

LIST_TEMPLATES = text(
    "SELECT name, channel, locale, subject, body, html, updated_at FROM templates"
    " WHERE (CAST(:name AS text) IS NULL OR name = :name)"
    "   AND (CAST(:channel AS text) IS NULL OR channel = :channel)"
    "   AND (CAST(:locale AS text) IS NULL OR locale = :locale)"
    " ORDER BY name, channel, locale"
)

DELETE_TEMPLATE = text(
    "DELETE FROM templates WHERE name = :name AND channel = :channel AND locale = :locale"
)


@dataclass(frozen=True, slots=True)
class TemplateRow:
    name: str
    channel: str
    locale: str
    subject: str | None
    body: str | None
    html: str | None
    updated_at: datetime


def templates_of(conn: Connection, keys: Iterable[tuple[str, str]]) -> list[TemplateRow]:
    """Every locale of the templates with these (name, channel) keys."""
    names, channels = columns(keys, 2)
    if not names:
        return []
    rows = conn.execute(TEMPLATES_OF, {"names": names, "channels": channels}).all()
    return [TemplateRow(*row) for row in rows]


def upsert_template(
    conn: Connection,
    name: str,
    channel: str,
    locale: str,
    parts: tuple[str | None, str | None, str | None],
) -> bool:
    """Write a template's (subject, body, html), replacing the version there was; whether new."""
    subject, body, html = parts
    params = {
        "name": name,
        "channel": channel,
        "locale": locale,
        "subject": subject,
        "body": body,
        "html": html,
    }
    return bool(conn.execute(UPSERT_TEMPLATE, params).scalar_one())


def list_templates(
    conn: Connection,
    name: str | None = None,
    channel: str | None = None,
    locale: str | None = None,
) -> list[TemplateRow]:
    params = {"name": name, "channel": channel, "locale": locale}
    return [TemplateRow(*row) for row in conn.execute(LIST_TEMPLATES, params).all()]


def delete_template(conn: Connection, name: str, channel: str, locale: str) -> bool:
    params = {"name": name, "channel": channel, "locale": locale}
    return int(conn.execute(DELETE_TEMPLATE, params).rowcount) > 0
