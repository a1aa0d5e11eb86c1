"""``notifier template ...`` and ``notifier suppress ...``: the content operators manage.

Exit status: 0 done; 1 nothing matched (``show``, ``rm``); 2 bad arguments, including a
template that does not compile (nothing is saved then).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from notifier import db
from notifier.db import content as content_db
from notifier.delivery import prepare
from notifier.settings import get_settings
from notifier.specs import normalize_locale


def add_parsers(sub: Any) -> None:
    """Add the ``template`` and ``suppress`` groups to the ``notifier`` parser's subparsers."""
    group = sub.add_parser("template", help="Jinja2 templates rows may name instead of a body")
    commands = group.add_subparsers(dest="template_command", required=True)

    p = commands.add_parser(
        "add",
        help="add a template, or replace its version in that locale (checked before saving)",
        description="Parts are Jinja2 with the row's payload and recipient as variables; the"
        " html part is autoescaped. A replaced version reaches every worker within"
        f" {prepare.TEMPLATE_CACHE_SECONDS:.0f} s.",
    )
    p.add_argument("name")
    p.add_argument("--channel", required=True)
    p.add_argument("--locale", help="e.g. de or de-AT (default: NOTIFIER_DEFAULT_LOCALE)")
    p.add_argument("--subject", help="e.g. 'Welcome, {{ first_name }}'")
    body = p.add_mutually_exclusive_group()
    body.add_argument("--body", help="the plain-text body")
    body.add_argument("--body-file", type=Path, help="read the plain-text body from this file")
    p.add_argument("--html-file", type=Path, help="read the HTML part from this file")
    p.set_defaults(func=_template_add)

    p = commands.add_parser("list", help="every template, by name, channel and locale")
    p.set_defaults(func=_template_list)

    p = commands.add_parser("show", help="a template's parts, in each of its locales")
    p.add_argument("name")
    p.add_argument("--channel")
    p.add_argument("--locale")
    p.set_defaults(func=_template_show)

    p = commands.add_parser("rm", help="remove a template's version in one locale")
    p.add_argument("name")
    p.add_argument("--channel", required=True)
    p.add_argument("--locale", required=True)
    p.set_defaults(func=_template_rm)

    group = sub.add_parser("suppress", help="recipients nothing is ever sent to")
    commands = group.add_subparsers(dest="suppress_command", required=True)

    p = commands.add_parser("add", help="never send to this recipient on this channel")
    p.add_argument("recipient")
    p.add_argument("--channel", required=True)
    p.add_argument("--reason", default="added by operator")
    p.set_defaults(func=_suppress_add)

    p = commands.add_parser("rm", help="send to this recipient again")
    p.add_argument("recipient")
    p.add_argument("--channel", required=True)
    p.set_defaults(func=_suppress_rm)

    p = commands.add_parser("list", help="the newest entries")
    p.add_argument("--channel")
    p.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    p.set_defaults(func=_suppress_list)


def _template_add(args: argparse.Namespace) -> int:
    locale = normalize_locale(args.locale or get_settings().default_locale)
    body = args.body if args.body_file is None else args.body_file.read_text(encoding="utf-8")
    html = None if args.html_file is None else args.html_file.read_text(encoding="utf-8")
    if args.subject is None and body is None and html is None:
        raise ValueError("give at least one of --subject, --body, --body-file, --html-file")
    try:
        prepare.compile_parts(args.subject, body, html)
    except ValueError as exc:
        raise ValueError(f"template {args.name!r} not saved: {exc}") from None
    with db.engine().begin() as conn:
        new = content_db.upsert_template(
            conn, args.name, args.channel, locale, (args.subject, body, html)
        )
    print(f"template {args.name!r} ({args.channel}, {locale}) {'added' if new else 'replaced'}")
    return 0


def _template_list(_: argparse.Namespace) -> int:
    with db.engine().connect() as conn:
        rows = content_db.list_templates(conn)
    table = [("NAME", "CHANNEL", "LOCALE", "PARTS", "UPDATED")]
    for t in rows:
        parts = ",".join(
            part
            for part, value in (("subject", t.subject), ("body", t.body), ("html", t.html))
            if value is not None
        )
        table.append((t.name, t.channel, t.locale, parts, f"{t.updated_at:%Y-%m-%d %H:%M:%S%z}"))
    _print_table(table)
    return 0


def _template_show(args: argparse.Namespace) -> int:
    locale = None if args.locale is None else normalize_locale(args.locale)
    with db.engine().connect() as conn:
        rows = content_db.list_templates(conn, args.name, args.channel, locale)
    if not rows:
        print(f"no template {args.name!r} matches")
        return 1
    for i, t in enumerate(rows):
        print(("\n" if i else "") + f"{t.name} ({t.channel}, {t.locale}), updated {t.updated_at}")
        for part, value in (("subject", t.subject), ("body", t.body), ("html", t.html)):
            if value is not None:
                print(f"--- {part}\n{value}")
    return 0


def _template_rm(args: argparse.Namespace) -> int:
    locale = normalize_locale(args.locale)
    with db.engine().begin() as conn:
        removed = content_db.delete_template(conn, args.name, args.channel, locale)
    where = f"({args.channel}, {locale})"
    print(f"template {args.name!r} {where} {'removed' if removed else 'not found'}")
    return 0 if removed else 1


def _suppress_add(args: argparse.Namespace) -> int:
    with db.engine().begin() as conn:
        entry, new = content_db.suppress(conn, args.channel, args.recipient, args.reason)
    if new:
        print(f"suppressed {entry.channel} {entry.recipient}")
    else:
        print(
            f"{entry.channel} {entry.recipient} already suppressed since {entry.created_at}:"
            f" {entry.reason}"
        )
    return 0


def _suppress_rm(args: argparse.Namespace) -> int:
    with db.engine().begin() as conn:
        removed = content_db.unsuppress(conn, args.channel, args.recipient)
    print(f"{args.channel} {args.recipient} {'no longer suppressed' if removed else 'not found'}")
    return 0 if removed else 1


def _suppress_list(args: argparse.Namespace) -> int:
    with db.engine().connect() as conn:
        rows = content_db.list_suppressions(conn, args.channel, args.limit)
    table = [("SINCE", "CHANNEL", "RECIPIENT", "REASON")]
    table += [
        (f"{s.created_at:%Y-%m-%d %H:%M:%S%z}", s.channel, s.recipient, s.reason) for s in rows
    ]
    _print_table(table)
    return 0


def _print_table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]))
