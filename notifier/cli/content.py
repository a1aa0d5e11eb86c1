"""``notifier template ...`` and ``notifier suppress ...``: the content operators manage.

Exit status: 0 done; 1 nothing matched (``show``, ``rm``); 2 bad arguments, including a
template that does not compile (nothing is saved then).
"""

from __future__ import annotations

from pathlib import Path

import click

from notifier import db
from notifier.cli import output
from notifier.cli.base import NOTHING_MATCHED, Group, exclusive
from notifier.cli.output import Table, Text
from notifier.cli.terminal import shown
from notifier.db import suppressions, templates
from notifier.delivery import prepare
from notifier.settings import get_settings
from notifier.specs import normalize_locale

_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)
_PARTS = ("subject", "body", "html")


@click.group(
    cls=Group,
    short_help="Jinja2 templates that rows name instead of a subject and body.",
    help="Jinja2 templates that rows name (with a locale) instead of carrying their own"
    " subject and body. Parts are rendered in a sandbox from the row's payload plus recipient;"
    " only the html part is autoescaped. Locale lookup: the row's (de-AT), its language (de),"
    " then NOTIFIER_DEFAULT_LOCALE.",
)
def template() -> None:
    pass


@template.command(
    short_help="Add a template, or replace its version in that locale.",
    help="Add template NAME for a channel and locale, or replace the version there is. Each"
    " part is compiled first; a part that does not compile saves nothing (exit status 2)."
    f" A replaced version reaches every worker within {prepare.TEMPLATE_CACHE_SECONDS:.0f} s."
    "\n\n\b\nExample:\n"
    "  notifier template add welcome --channel email --locale de \\\n"
    "      --subject 'Willkommen, {{ first_name }}' --body-file welcome.de.txt \\\n"
    "      --html-file welcome.de.html",
)
@click.argument("name")
@click.option(
    "--channel",
    required=True,
    metavar="CHANNEL",
    help="The channel the template is for: email, sms, push, ...",
)
@click.option(
    "--locale",
    metavar="LOCALE",
    help="e.g. de or de-AT.  [default: NOTIFIER_DEFAULT_LOCALE]",
)
@click.option("--subject", metavar="TEMPLATE", help="e.g. 'Welcome, {{ first_name }}'.")
@click.option("--body", metavar="TEMPLATE", help="The plain-text body. Instead of --body-file.")
@click.option(
    "--body-file",
    type=_FILE,
    metavar="FILE",
    help="Read the plain-text body from this file (UTF-8). Instead of --body.",
)
@click.option(
    "--html-file", type=_FILE, metavar="FILE", help="Read the HTML part from this file (UTF-8)."
)
@output.json_option
def add(
    name: str,
    channel: str,
    locale: str | None,
    subject: str | None,
    body: str | None,
    body_file: Path | None,
    html_file: Path | None,
) -> int:
    exclusive(click.get_current_context(), "body", "body_file")
    locale = normalize_locale(locale or get_settings().default_locale)
    if body_file is not None:
        body = body_file.read_text(encoding="utf-8")
    html = None if html_file is None else html_file.read_text(encoding="utf-8")
    if subject is None and body is None and html is None:
        raise ValueError("give at least one of --subject, --body, --body-file, --html-file")
    try:
        prepare.compile_parts(subject, body, html)
    except ValueError as exc:
        raise ValueError(f"template {name!r} not saved: {exc}") from None
    with db.engine().begin() as conn:
        new = templates.upsert_template(conn, name, channel, locale, (subject, body, html))
    output.emit(
        {"name": name, "channel": channel, "locale": locale, "added": new},
        Text(
            f"template {output.quoted(name)} ({shown(channel)}, {locale})"
            f" {'added' if new else 'replaced'}"
        ),
    )
    return 0


def _parts(t: templates.TemplateRow) -> list[str]:
    return [part for part in _PARTS if getattr(t, part) is not None]


@template.command(
    "list",
    short_help="Every template, by name, channel and locale.",
    help="Every template, by name, channel and locale, with the parts each has and when it"
    " was last changed.",
)
@output.json_option
def list_templates() -> int:
    with db.engine().connect() as conn:
        rows = templates.list_templates(conn)
    output.emit(
        [
            {
                "name": t.name,
                "channel": t.channel,
                "locale": t.locale,
                "parts": _parts(t),
                "updated_at": t.updated_at,
            }
            for t in rows
        ],
        Table(
            ["NAME", "CHANNEL", "LOCALE", "PARTS", "UPDATED"],
            [
                (
                    t.name,
                    t.channel,
                    t.locale,
                    ",".join(_parts(t)),
                    f"{t.updated_at:%Y-%m-%d %H:%M:%S%z}",
                )
                for t in rows
            ],
        ),
    )
    return 0


@template.command(
    short_help="A template's parts, in each of its locales.",
    help="Template NAME's parts as stored, in each of its channels and locales (or only those"
    " given). Exit status 1 if none matches.\n\nExample: notifier template show welcome"
    " --locale de",
)
@click.argument("name")
@click.option("--channel", metavar="CHANNEL", help="Only this channel's version.")
@click.option("--locale", metavar="LOCALE", help="Only this locale's version, e.g. de-AT.")
@output.json_option
def show(name: str, channel: str | None, locale: str | None) -> int:
    locale = None if locale is None else normalize_locale(locale)
    with db.engine().connect() as conn:
        rows = templates.list_templates(conn, name, channel, locale)
    blocks: list[output.Block] = []
    for i, t in enumerate(rows):
        head = f"{shown(t.name)} ({shown(t.channel)}, {t.locale}), updated {shown(t.updated_at)}"
        parts = "".join(
            f"\n--- {part}\n{getattr(t, part)}" for part in _PARTS if getattr(t, part) is not None
        )
        blocks.append(Text(("\n" if i else "") + head + parts))
    if not rows:
        blocks.append(Text(f"no template {output.quoted(name)} matches"))
    output.emit(
        [
            {
                "name": t.name,
                "channel": t.channel,
                "locale": t.locale,
                "updated_at": t.updated_at,
                **{part: getattr(t, part) for part in _PARTS},
            }
            for t in rows
        ],
        *blocks,
    )
    return 0 if rows else NOTHING_MATCHED


@template.command(
    short_help="Remove a template's version in one locale.",
    help="Remove template NAME's version for this channel and locale. Rows that name it then"
    " get the next version in the lookup (the locale's language, then"
    " NOTIFIER_DEFAULT_LOCALE), or go dead if there is none. Exit status 1 if there was no"
    " such version.",
)
@click.argument("name")
@click.option("--channel", required=True, metavar="CHANNEL", help="Its channel, e.g. email.")
@click.option("--locale", required=True, metavar="LOCALE", help="Its locale, e.g. de-AT.")
@output.json_option
def rm(name: str, channel: str, locale: str) -> int:
    locale = normalize_locale(locale)
    with db.engine().begin() as conn:
        removed = templates.delete_template(conn, name, channel, locale)
    output.emit(
        {"name": name, "channel": channel, "locale": locale, "removed": removed},
        Text(
            f"template {output.quoted(name)} ({shown(channel)}, {locale})"
            f" {'removed' if removed else 'not found'}"
        ),
    )
    return 0 if removed else NOTHING_MATCHED


# --- suppress ---------------------------------------------------------------------------------


@click.group(
    cls=Group,
    short_help="Recipients nothing is ever sent to.",
    help="Recipients nothing is ever sent to on a channel: a row to one is cancelled with"
    " last_error 'suppressed: <reason>'. Email addresses are compared without surrounding"
    " whitespace and case-insensitively; SMS numbers and push tokens exactly. Hard bounces"
    " are added automatically.",
)
def suppress() -> None:
    pass


@suppress.command(
    "add",
    short_help="Never send to this recipient on this channel.",
    help="Never send to RECIPIENT on this channel again. An entry that is there already keeps"
    " its reason and time.\n\n\b\nExample:\n"
    '  notifier suppress add --channel email ann@example.com --reason "asked us"',
)
@click.argument("recipient")
@click.option(
    "--channel",
    required=True,
    metavar="CHANNEL",
    help="The channel to stop sending on: email, sms, push, ...",
)
@click.option(
    "--reason", default="added by operator", metavar="TEXT", help="Why, kept with the entry."
)
@output.json_option
def suppress_add(recipient: str, channel: str, reason: str) -> int:
    with db.engine().begin() as conn:
        entry, new = suppressions.suppress(conn, channel, recipient, reason)
    who = f"{shown(entry.channel)} {shown(entry.recipient)}"
    output.emit(
        {
            "channel": entry.channel,
            "recipient": entry.recipient,
            "reason": entry.reason,
            "since": entry.created_at,
            "added": new,
        },
        Text(
            f"suppressed {who}"
            if new
            else f"{who} already suppressed since {shown(entry.created_at)}: {shown(entry.reason)}"
        ),
    )
    return 0


@suppress.command(
    "rm",
    short_help="Send to this recipient again.",
    help="Send to RECIPIENT on this channel again: removes its entry, of any kind, and its"
    " opt-outs of categories. Exit status 1 if it was not suppressed.",
)
@click.argument("recipient")
@click.option(
    "--channel",
    required=True,
    metavar="CHANNEL",
    help="The channel to send on again: email, sms, push, ...",
)
@output.json_option
def suppress_rm(recipient: str, channel: str) -> int:
    with db.engine().begin() as conn:
        removed = suppressions.unsuppress(conn, channel, recipient)
    output.emit(
        {"channel": channel, "recipient": recipient, "removed": removed},
        Text(
            f"{shown(channel)} {shown(recipient)}"
            f" {'no longer suppressed' if removed else 'not found'}"
        ),
    )
    return 0 if removed else NOTHING_MATCHED


@suppress.command(
    "list",
    short_help="The newest entries.",
    help="The newest entries of the suppression list, newest first.",
)
@click.option("--channel", metavar="CHANNEL", help="Only this channel's entries.")
@click.option(
    "--limit", type=click.IntRange(min=1), default=100, metavar="N", help="At most N entries."
)
@output.json_option
def suppress_list(channel: str | None, limit: int) -> int:
    with db.engine().connect() as conn:
        rows = suppressions.list_suppressions(conn, channel, limit)
    output.emit(
        [
            {
                "since": s.created_at,
                "channel": s.channel,
                "recipient": s.recipient,
                "kind": s.kind,
                "reason": s.reason,
            }
            for s in rows
        ],
        Table(
            ["SINCE", "CHANNEL", "RECIPIENT", "KIND", "REASON"],
            [
                (f"{s.created_at:%Y-%m-%d %H:%M:%S%z}", s.channel, s.recipient, s.kind, s.reason)
                for s in rows
            ],
        ),
    )
    return 0


COMMANDS = (template, suppress)
