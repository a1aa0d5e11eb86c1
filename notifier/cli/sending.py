"""``notifier send``: queue one notification by hand, checked first as a worker would check it.

Exit status: 0 queued (or already queued under its ``--key``); 2 a row no worker could send, or
bad arguments; nothing is written then.
"""

from __future__ import annotations

import difflib
from datetime import UTC, datetime, timedelta
from typing import Any

import click

from notifier import client, db
from notifier.cli import output
from notifier.cli.base import Command, exclusive
from notifier.cli.output import Text
from notifier.cli.parsing import DURATION, JSON_OBJECT, TIME
from notifier.providers import load_registry
from notifier.settings import get_settings


@click.command(
    cls=Command,
    short_help="Queue one notification and print its id.",
    help="Queue one notification and print its id (with --key, a second send with the same key"
    " writes nothing and prints the first row's id). The row is checked first as a worker"
    " checks it (channel, recipient, subject and body, payload, template and locale, guard):"
    " one it could never send is refused with the reason it would record, exit status 2, and"
    " nothing is written.\n\n"
    "\b\nExamples:\n"
    "  notifier send --channel email --to ann@example.com --subject hi --body hello\n"
    "  notifier send --channel email --to ann@example.com --template welcome \\\n"
    '      --locale de-AT --payload \'{"first_name": "Ann"}\'\n'
    "  notifier send --channel email --to ann@example.com --subject 'Please confirm' \\\n"
    "      --key confirm-reminder:user:42 --in 24h --guard http --expires-in 48h",
)
@click.option(
    "--channel",
    required=True,
    metavar="CHANNEL",
    help="email, sms, push, webhook, null, or another installed provider's channel.",
)
@click.option(
    "--to",
    required=True,
    metavar="RECIPIENT",
    help="An email address, an E.164 phone number (+14155550100), a push token, or an https"
    " URL for webhooks.",
)
@click.option("--subject", metavar="TEXT", help="The subject (email, push).")
@click.option("--body", metavar="TEXT", help="The body.")
@click.option(
    "--payload",
    type=JSON_OBJECT,
    metavar="JSON",
    help='Channel extras and template variables, a JSON object: \'{"html": "<p>hi</p>"}\'.',
)
@click.option(
    "--key",
    metavar="KEY",
    help="Dedupe key, e.g. signup:42: a second send with the same key writes nothing, and"
    " 'notifier cancel KEY' withdraws the row.",
)
@click.option(
    "--in",
    "delay",
    type=DURATION,
    metavar="DURATION",
    help="Send this long from now: a number and s, m, h or d, e.g. 90s or 24h (at most"
    " 3650d). Instead of --at.",
)
@click.option(
    "--at",
    type=TIME,
    metavar="TIME",
    help="Send at this ISO 8601 time, e.g. 2026-12-01T09:00:00+01:00 (UTC without a zone)."
    " Instead of --in.",
)
@click.option(
    "--max-attempts",
    type=int,
    default=5,
    metavar="N",
    help="Attempts before the row is given up as dead.",
)
@click.option(
    "--priority",
    type=int,
    default=0,
    metavar="N",
    help="Due rows are sent highest priority first, e.g. 10 for a password reset; campaigns"
    " use -10.",
)
@click.option(
    "--expires-in",
    type=DURATION,
    metavar="DURATION",
    help="Cancel the row instead of sending it if it is still unsent this long from now, e.g."
    " 10m; must end after the send time (--in, --at).",
)
@click.option(
    "--guard",
    metavar="NAME",
    help="A check that must agree right before the send, e.g. http (asks NOTIFIER_GUARD_HTTP_URL).",
)
@click.option(
    "--template",
    metavar="NAME",
    help="A stored template (notifier template list) to render from --payload instead of"
    " --subject/--body.",
)
@click.option(
    "--locale",
    metavar="LOCALE",
    help="The template's locale, e.g. de-AT.  [default: NOTIFIER_DEFAULT_LOCALE]",
)
@click.option(
    "--category",
    metavar="NAME",
    help="What the message is, e.g. marketing or security: an opt-out of a category stops"
    " only its rows.  [default: none, transactional]",
)
@output.json_option
def send(
    channel: str,
    to: str,
    delay: timedelta | None,
    at: datetime | None,
    expires_in: timedelta | None,
    **fields: Any,
) -> int:
    exclusive(click.get_current_context(), "delay", "at")
    _check_channel(channel)
    now = datetime.now(UTC)
    send_at = at if at is not None else now + (delay or timedelta(0))
    if expires_in is not None and now + expires_in <= send_at:
        raise ValueError(
            "--expires-in ends before the send time (--in or --at): the row would expire unsent"
        )
    with db.engine().begin() as conn:
        result = client.enqueue(
            conn,
            channel=channel,
            to=to,
            send_at=at,
            delay=delay,
            expires_at=None if expires_in is None else datetime.now(UTC) + expires_in,
            **fields,
        )
    key = fields["key"]
    output.emit(
        {"id": result.id, "created": result.created, "key": key},
        Text(
            str(result.id)
            if result.created
            else f"{result.id} (already queued with key {output.quoted(key)}; nothing written)"
        ),
    )
    return 0


def _check_channel(channel: str) -> None:
    """Refuse a channel no installed provider serves, before a row is written for it."""
    registry = load_registry(get_settings())
    channels = sorted({p.channel for p in registry.values()})
    registry.close()
    if channel in channels:
        return
    close = difflib.get_close_matches(channel, channels, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ValueError(
        f"no provider serves channel {output.quoted(channel)}"
        f" (installed: {', '.join(channels)}){hint}"
    )


COMMANDS = (send,)
