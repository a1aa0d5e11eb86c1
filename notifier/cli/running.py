"""``notifier migrate``, ``health``, ``metrics`` and ``events``: what keeps notifier running.

``migrate`` brings the schema to a release; ``health`` is the compose healthcheck (exit status 0
all checks pass, 1 one fails); ``metrics`` and ``events`` serve until stopped.
"""

from __future__ import annotations

import click
from sqlalchemy.engine import make_url

from notifier import db, health, logs, metrics, redis_access
from notifier.cli import output, terminal
from notifier.cli.base import NOTHING_MATCHED, Command
from notifier.cli.output import Table, Text
from notifier.db import migrate
from notifier.providers import load_registry
from notifier.settings import get_settings


@click.command(
    "migrate",
    cls=Command,
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
    name = make_url(get_settings().session_database_url).database
    output.emit(
        {
            "database": name,
            "created": any(line.startswith("created database") for line in said),
            "revision": down_to or "head",
        },
        Text("\n".join(terminal.shown(line) for line in said)),
    )
    return 0


@click.command(
    "health",
    cls=Command,
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
    redis_client = redis_access.client(settings, timeout=5)
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


@click.command(
    "metrics",
    cls=Command,
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
    redis_client = redis_access.client(settings, timeout=5)
    labels = metrics.Labels.of(load_registry(get_settings()))
    metrics.serve(db.engine(), redis_client, labels, port or settings.metrics_port, host)
    return 0


@click.command(
    cls=Command,
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
    redis_client = redis_access.client(settings, timeout=5)
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


COMMANDS = (migrate_command, health_command, metrics_command, events)
