"""The ``notifier`` command: its root, ``send``, ``migrate``, ``health`` and ``metrics``; the other
command groups live beside it (``ops``, ``campaigns``, ``content``)."""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from importlib import metadata

import redis
from sqlalchemy.exc import InterfaceError, OperationalError

from notifier import client, db, health, logs, metrics
from notifier.cli import campaigns as campaign_cli
from notifier.cli import content as content_cli
from notifier.cli import ops as ops_cli
from notifier.cli import terminal
from notifier.cli.parsing import parse_duration, parse_when
from notifier.console import command as console_command
from notifier.db import errors, migrate
from notifier.providers import load_registry
from notifier.settings import get_settings


def _payload(value: str) -> dict[str, object]:
    try:
        data = json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"--payload is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError("--payload must be a JSON object")
    return data


def _cmd_migrate(args: argparse.Namespace) -> int:
    migrate.migrate(down_to=args.down_to)
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
        f"no provider serves channel {_shown(channel)} (installed: {', '.join(channels)}){hint}"
    )


def _shown(value: str) -> str:
    return terminal.shown(repr(value))


def _cmd_send(args: argparse.Namespace) -> int:
    _check_channel(args.channel)
    now = datetime.now(UTC)
    send_at = args.at if args.at is not None else now + (args.delay or timedelta(0))
    if args.expires_in is not None and now + args.expires_in <= send_at:
        raise ValueError(
            "--expires-in ends before the send time (--in or --at): the row would expire unsent"
        )
    with db.engine().begin() as conn:
        result = client.enqueue(
            conn,
            channel=args.channel,
            to=args.to,
            subject=args.subject,
            body=args.body,
            payload=args.payload,
            key=args.key,
            send_at=args.at,
            delay=args.delay,
            max_attempts=args.max_attempts,
            priority=args.priority,
            expires_at=None if args.expires_in is None else datetime.now(UTC) + args.expires_in,
            guard=args.guard,
            template=args.template,
            locale=args.locale,
        )
    if not result.created:
        key = terminal.shown(repr(args.key))
        print(f"{result.id} (already queued with key {key}; nothing written)")
    else:
        print(result.id)
    return 0


def _cmd_health(args: argparse.Namespace) -> int:
    settings = get_settings()
    client = redis.Redis.from_url(settings.redis_url, socket_timeout=5, socket_connect_timeout=5)
    checks = health.check(
        db.engine(), client, settings, settings.heartbeat_file if args.worker else None
    )
    client.close()
    if args.json:
        terminal.json_line([{"check": c.name, "ok": c.ok, "detail": c.detail} for c in checks])
    else:
        for c in checks:
            print(f"{'ok  ' if c.ok else 'FAIL'}  {c.name:<9} {terminal.shown(c.detail)}")
    return 0 if all(c.ok for c in checks) else 1


def _cmd_metrics(args: argparse.Namespace) -> int:
    settings = get_settings()
    client = redis.Redis.from_url(settings.redis_url, socket_timeout=5, socket_connect_timeout=5)
    labels = metrics.Labels.of(load_registry(get_settings()))
    metrics.serve(db.engine(), client, labels, args.port or settings.metrics_port, args.host)
    return 0


def _cmd_events(args: argparse.Namespace) -> int:
    import uvicorn

    from notifier.events.app import create_app

    settings = get_settings()
    client = redis.Redis.from_url(settings.redis_url, socket_timeout=5, socket_connect_timeout=5)
    app = create_app(settings, db.engine(), client)
    # Behind a TLS-terminating proxy; Twilio's signature uses NOTIFIER_EVENTS_PUBLIC_URL, not
    # the Host header, so no forwarded header is trusted.
    uvicorn.run(app, host=args.host, port=args.port or settings.events_port, proxy_headers=False)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="notifier", description=__doc__)
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {metadata.version('notifier')}"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("migrate", help="create the database if needed and apply migrations")
    p.add_argument(
        "--down-to",
        metavar="REVISION",
        help="undo the migrations after REVISION (e.g. 0011), to roll back a release",
    )
    p.set_defaults(func=_cmd_migrate)

    p = sub.add_parser("send", help="queue one notification and print its id")
    p.add_argument("--channel", required=True, help="email, webhook, null, ...")
    p.add_argument("--to", required=True, help="recipient: email address, https URL, ...")
    p.add_argument("--subject")
    p.add_argument("--body")
    p.add_argument("--payload", type=_payload, help="channel extras as a JSON object")
    p.add_argument("--key", help="dedupe key: a second send with the same key writes nothing")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--in", dest="delay", type=parse_duration, help="send later, e.g. 24h")
    when.add_argument("--at", type=parse_when, help="send at an ISO 8601 time")
    p.add_argument("--max-attempts", type=int, default=5)
    p.add_argument("--priority", type=int, default=0, help="higher is sent first")
    p.add_argument(
        "--expires-in", type=parse_duration, help="cancel instead of sending after this, e.g. 10m"
    )
    p.add_argument("--guard", help="send-time check that must agree, e.g. http")
    p.add_argument("--template", help="a stored template to render from --payload")
    p.add_argument("--locale", help="the template's locale, e.g. de-AT")
    p.set_defaults(func=_cmd_send)

    p = sub.add_parser(
        "health", help="exit 0 if PostgreSQL and Redis answer and due work is being claimed"
    )
    p.add_argument(
        "--worker", action="store_true", help="also require this worker's recent heartbeat"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_health)

    campaign_cli.add_parser(sub)

    p = sub.add_parser("metrics", help="serve Prometheus metrics (NOTIFIER_METRICS_PORT)")
    p.add_argument("--port", type=int, help="default: NOTIFIER_METRICS_PORT")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on")  # noqa: S104
    p.set_defaults(func=_cmd_metrics)

    p = sub.add_parser(
        "events",
        help="serve providers' delivery webhooks and one-click unsubscribes (NOTIFIER_EVENTS_PORT)",
    )
    p.add_argument("--port", type=int, help="default: NOTIFIER_EVENTS_PORT")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on")  # noqa: S104
    p.set_defaults(func=_cmd_events)

    ops_cli.add_parsers(sub)
    content_cli.add_parsers(sub)
    console_command.add_parser(sub)
    return parser


#: Exit statuses besides 0 (done), 1 (nothing matched), 2 (bad arguments or settings) and 3
#: (the operator declined): the database cannot be reached, it does not exist, Redis cannot be
#: reached.
DATABASE_UNREACHABLE, DATABASE_MISSING, REDIS_UNREACHABLE = 4, 5, 6


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        logs.configure(get_settings())
        with terminal.guarded():
            return int(args.func(args))
    except (OperationalError, InterfaceError) as exc:
        line = errors.connection_problem(exc, get_settings().database_url)
        if line is None:
            raise
        print(f"notifier: {terminal.shown(line)}", file=sys.stderr)
        return DATABASE_MISSING if errors.database_missing(exc) else DATABASE_UNREACHABLE
    except redis.ConnectionError as exc:
        print(
            f"notifier: cannot connect to Redis (NOTIFIER_REDIS_URL): {terminal.shown(exc)}",
            file=sys.stderr,
        )
        return REDIS_UNREACHABLE
    except (ValueError, OSError) as exc:
        print(f"notifier: {terminal.shown(exc)}", file=sys.stderr)
        return 2
