"""The ``notifier`` command: its root, ``send``, ``migrate``, ``health``, ``metrics`` and
``events``; the other command groups live beside it (``looking``, ``changes``, ``campaigns``,
``content``, ``console``).

``main`` runs it for the console script, ``python -m notifier.cli`` and the tests, and turns
what went wrong into one line on stderr and an exit status (see ``notifier.cli.base``).
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import click
import redis
from sqlalchemy.engine import make_url

from notifier import client, db, health, logs, metrics
from notifier.cli import campaigns as campaign_cli
from notifier.cli import changes, looking, output, terminal
from notifier.cli import console as console_cli
from notifier.cli import content as content_cli
from notifier.cli.base import (
    BAD_USAGE,
    CONTEXT,
    DATABASE_MISSING,
    DATABASE_UNREACHABLE,
    NOTHING_MATCHED,
    REDIS_UNREACHABLE,
    Group,
    exclusive,
)
from notifier.cli.output import Table, Text
from notifier.cli.parsing import DURATION, JSON_OBJECT, TIME
from notifier.db import errors, migrate
from notifier.providers import load_registry
from notifier.settings import get_settings

__all__ = ["DATABASE_MISSING", "DATABASE_UNREACHABLE", "REDIS_UNREACHABLE", "cli", "main"]

#: Exit status after Ctrl-C, as a shell reports a process SIGINT stopped.
INTERRUPTED = 130

SECTIONS = (
    ("Notifications", ("send", "show", "cancel", "requeue", "stats")),
    ("Campaigns and content", ("campaign", "template", "suppress")),
    ("Running notifier", ("migrate", "health", "purge", "metrics", "events", "console")),
)

HELP = """\
notifier delivers the notifications other services write into a PostgreSQL table, by email,
SMS, push or webhook: it retries transient failures with backoff, gives up on the ones that
can never work with a reason, and sends nothing twice. Celery workers do the sending; these
commands are for the people who run it.

Settings are NOTIFIER_* environment variables (docs/configuration.md); a misspelt one
stops every command with exit status 2, naming it.

\b
Exit statuses:
  0  done
  1  nothing matched (no such row; nothing to change)
  2  bad arguments or settings; nothing was done
  3  the operator answered no to the confirmation; nothing changed
  4  the database cannot be reached or refuses the login (NOTIFIER_DATABASE_URL)
  5  the database does not exist (notifier migrate creates it)
  6  Redis cannot be reached (NOTIFIER_REDIS_URL)

'notifier COMMAND --help' shows a command's options. Every command that prints takes --json:
one JSON document on stdout with the same data.

\b
Tab completion: add to ~/.bashrc (zsh and fish: docs/operations.md)
  eval "$(_NOTIFIER_COMPLETE=bash_source notifier)"
"""


@click.group(cls=Group, context_settings=CONTEXT, sections=SECTIONS, help=HELP)
@click.version_option(
    package_name="notifier",
    prog_name="notifier",
    message="%(prog)s %(version)s",
    help="Print notifier's version and exit.",
)
def cli() -> None:
    pass


# --- migrate -------------------------------------------------------------------------------------


@cli.command(
    "migrate",
    short_help="Create the database if needed and apply the migrations.",
    help="Create the database NOTIFIER_DATABASE_URL names if it does not exist, then bring it"
    " to the newest schema (harmless to repeat); or, with --down-to, undo the migrations"
    " after a revision, to roll back a release.\n\n"
    "Example: notifier migrate --down-to 0011",
)
@click.option(
    "--down-to",
    metavar="REVISION",
    help="Undo the migrations after REVISION (e.g. 0011): the schema of the release to go back to.",
)
@output.json_option
def migrate_command(down_to: str | None) -> int:
    said: list[str] = []
    migrate.migrate(down_to=down_to, say=said.append)
    name = make_url(get_settings().database_url).database
    output.emit(
        {
            "database": name,
            "created": any(line.startswith("created database") for line in said),
            "revision": down_to or "head",
        },
        Text("\n".join(terminal.shown(line) for line in said)),
    )
    return 0


# --- send ----------------------------------------------------------------------------------------


@cli.command(
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


# --- health, metrics, events ---------------------------------------------------------------------


@cli.command(
    "health",
    short_help="Exit 0 if PostgreSQL and Redis answer and due work is claimed.",
    help="Check that PostgreSQL and Redis answer, that due rows are being claimed, and that no"
    " rows are held by a worker that has stopped. One line per check; exit status 0 if all"
    " pass, 1 if any fails. Used as the compose healthcheck.\n\n"
    "Example: notifier health --worker",
)
@click.option(
    "--worker",
    is_flag=True,
    help="Also require this worker's heartbeat (NOTIFIER_HEARTBEAT_FILE) to be recent: the"
    " check for a worker's own container.",
)
@output.json_option
def health_command(worker: bool) -> int:
    settings = get_settings()
    redis_client = redis.Redis.from_url(
        settings.redis_url, socket_timeout=5, socket_connect_timeout=5
    )
    checks = health.check(
        db.engine(), redis_client, settings, settings.heartbeat_file if worker else None
    )
    redis_client.close()
    output.emit(
        [{"check": c.name, "ok": c.ok, "detail": c.detail} for c in checks],
        Table(None, [("ok" if c.ok else "FAIL", c.name, c.detail) for c in checks]),
    )
    return 0 if all(c.ok for c in checks) else NOTHING_MATCHED


_HOST = click.option(
    "--host",
    default="0.0.0.0",  # noqa: S104
    metavar="ADDRESS",
    help="Address to listen on; 127.0.0.1 for this machine only.",
)


@cli.command(
    "metrics",
    short_help="Serve Prometheus metrics on NOTIFIER_METRICS_PORT (9808).",
    help="Serve Prometheus metrics at /metrics: attempts by channel, provider and outcome,"
    " send durations, due rows, the lag, rows processing, deaths in the last hour. They add"
    " up across every worker on every machine (counted in Redis). Runs until stopped.",
)
@click.option(
    "--port",
    type=int,
    metavar="PORT",
    help="Port to listen on.  [default: NOTIFIER_METRICS_PORT, 9808]",
)
@_HOST
def metrics_command(port: int | None, host: str) -> int:
    settings = get_settings()
    redis_client = redis.Redis.from_url(
        settings.redis_url, socket_timeout=5, socket_connect_timeout=5
    )
    labels = metrics.Labels.of(load_registry(get_settings()))
    metrics.serve(db.engine(), redis_client, labels, port or settings.metrics_port, host)
    return 0


@cli.command(
    short_help="Serve providers' delivery webhooks and one-click unsubscribes.",
    help="Serve the providers' delivery reports (delivered, bounced, complained) and one-click"
    " unsubscribes, on NOTIFIER_EVENTS_PORT (8025), behind a TLS-terminating proxy whose https"
    " address is NOTIFIER_EVENTS_PUBLIC_URL. Runs until stopped.",
)
@click.option(
    "--port",
    type=int,
    metavar="PORT",
    help="Port to listen on.  [default: NOTIFIER_EVENTS_PORT, 8025]",
)
@_HOST
def events(port: int | None, host: str) -> int:
    import uvicorn

    from notifier.events.app import create_app

    settings = get_settings()
    redis_client = redis.Redis.from_url(
        settings.redis_url, socket_timeout=5, socket_connect_timeout=5
    )
    app = create_app(settings, db.engine(), redis_client)
    # uvicorn's loggers go through notifier's handler (NOTIFIER_LOG_FORMAT, masking), and its
    # access log shows /u/ paths without their tokens.
    logs.redact_access_paths()
    # Behind a TLS-terminating proxy; Twilio's signature uses NOTIFIER_EVENTS_PUBLIC_URL, not
    # the Host header, so no forwarded header is trusted.
    uvicorn.run(
        app,
        host=host,
        port=port or settings.events_port,
        proxy_headers=False,
        log_config=None,
    )
    return 0


for _command in (
    *looking.COMMANDS,
    *changes.COMMANDS,
    campaign_cli.campaign,
    *content_cli.COMMANDS,
    console_cli.command,
):
    cli.add_command(_command)


# --- running it ----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``notifier ARGV`` (default: this process's arguments); return its exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        with terminal.guarded():
            status = cli.main(args, prog_name="notifier", standalone_mode=False)
            _flush()
        return int(status or 0)
    except click.ClickException as exc:  # usage errors: exit status 2
        exc.show()
        return exc.exit_code
    except click.Abort:  # Ctrl-C
        output.error("interrupted")
        return INTERRUPTED
    except errors.DRIVER_ERRORS as exc:
        problem = errors.diagnose(exc, get_settings().database_url)
        if problem is None:
            raise
        output.error(problem.line)
        return DATABASE_MISSING if problem.missing else DATABASE_UNREACHABLE
    except redis.ConnectionError as exc:
        output.error(f"cannot connect to Redis (NOTIFIER_REDIS_URL): {exc}")
        return REDIS_UNREACHABLE
    except BrokenPipeError:  # stdout's reader has gone (notifier stats | head -1)
        output.stdout_closed()
        return 0
    except (ValueError, OSError) as exc:
        output.error(exc)
        return BAD_USAGE


def _flush() -> None:
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        output.stdout_closed()
