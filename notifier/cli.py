"""The `notifier` command; operator commands live in ops_cli, campaign ones in campaign_cli."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from importlib import metadata
from pathlib import Path

import redis
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from notifier import (
    campaign_cli,
    client,
    content_cli,
    health,
    logs,
    metrics,
    ops_cli,
    store,
    terminal,
)
from notifier.console import command as console_command
from notifier.providers import load_registry
from notifier.settings import get_settings

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])", re.ASCII)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
#: The longest duration any option takes: ten years reaches any row worth naming, and a time
#: that far from now is still a date PostgreSQL and Python can both hold.
MAX_DURATION = timedelta(days=3650)


def _quoted(value: str) -> str:
    """An argument as an error message shows it: quoted, cut short, control characters spelled."""
    return terminal.shown(repr(value if len(value) <= 40 else value[:40] + "..."))


def parse_duration(value: str) -> timedelta:
    """``90s``, ``15m``, ``24h``, ``7d`` -> a timedelta, at most ``MAX_DURATION``."""
    match = _DURATION.fullmatch(value.strip())
    shown = _quoted(value)
    if not match:
        raise argparse.ArgumentTypeError(
            f"{shown} is not a duration: use a number and s, m, h or d (e.g. 24h)"
        )
    seconds = float(match[1]) * _UNITS[match[2]]
    if seconds > MAX_DURATION.total_seconds():
        raise argparse.ArgumentTypeError(f"{shown} is too long: at most {MAX_DURATION.days}d")
    return timedelta(seconds=seconds)


def whole_number(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high``."""

    def parse(value: str) -> int:
        text = value.strip()
        shown = _quoted(text)
        if not re.fullmatch(r"-?\d+", text, re.ASCII):
            raise argparse.ArgumentTypeError(f"{shown} is not a whole number")
        if len(text) > 19 or not low <= int(text) <= high:
            raise argparse.ArgumentTypeError(f"{shown} is out of range: {low} to {high}")
        return int(text)

    return parse


def parse_when(value: str) -> datetime:
    """An ISO 8601 time; without a zone it is taken as UTC."""
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an ISO 8601 time (e.g. 2026-12-01T09:00:00+00:00)"
        ) from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _payload(value: str) -> dict[str, object]:
    try:
        data = json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"--payload is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError("--payload must be a JSON object")
    return data


def alembic_dir() -> Path:
    """The migrations: ``notifier/_migrations`` once installed from a wheel (pyproject.toml puts
    them there), the repository's ``alembic/`` in a checkout or an editable install."""
    package = Path(__file__).resolve().parent
    for place in (package / "_migrations", package.parent / "alembic"):
        if (place / "env.py").is_file():
            return place
    raise FileNotFoundError(f"notifier's migrations are missing from {package}: reinstall it")


def migrate(database_url: str | None = None, *, down_to: str | None = None) -> None:
    """Create the database if it does not exist, then upgrade it to the newest schema; or, with
    ``down_to`` (a revision such as ``0011``), undo the migrations after that one."""
    from alembic import command
    from alembic.config import Config

    url = make_url(database_url or get_settings().database_url)
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        exists = conn.execute(
            text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": url.database}
        ).first()
        if not exists:
            quoted = conn.dialect.identifier_preparer.quote(url.database or "notifier")
            conn.execute(text(f"CREATE DATABASE {quoted}"))
            print(f"created database {url.database}")
    admin.dispose()

    config = Config()
    config.set_main_option("script_location", str(alembic_dir()))
    config.attributes["configure_logging"] = False
    engine = create_engine(url)
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        if down_to is None:
            command.upgrade(config, "head")
        else:
            command.downgrade(config, down_to)
    engine.dispose()
    where = "the newest schema" if down_to is None else f"revision {down_to}"
    print(f"database {url.database} is at {where}")


def _cmd_migrate(args: argparse.Namespace) -> int:
    migrate(down_to=args.down_to)
    return 0


def _cmd_send(args: argparse.Namespace) -> int:
    with store.engine().begin() as conn:
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
        store.engine(), client, settings, settings.heartbeat_file if args.worker else None
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
    labels = metrics.Labels.of(load_registry())
    metrics.serve(store.engine(), client, labels, args.port or settings.metrics_port, args.host)
    return 0


def _cmd_events(args: argparse.Namespace) -> int:
    import uvicorn

    from notifier.events.app import create_app

    settings = get_settings()
    client = redis.Redis.from_url(settings.redis_url, socket_timeout=5, socket_connect_timeout=5)
    app = create_app(settings, store.engine(), client)
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


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        logs.configure(get_settings())
        with terminal.guarded():
            return int(args.func(args))
    except (ValueError, OSError) as exc:
        print(f"notifier: {terminal.shown(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
