"""``notifier api`` (serve the HTTP API) and ``notifier api-key`` (its keys).

Exit status: 0 done; 1 no such live key (``revoke``); 2 bad arguments (nothing is saved then).
"""

from __future__ import annotations

import gc
import json
import sys

import click

from notifier import db, logs, redis_access
from notifier.api import keys, openapi
from notifier.cli import output
from notifier.cli.base import NOTHING_MATCHED, Group
from notifier.cli.output import Table, Text
from notifier.db import api as api_db
from notifier.settings import get_settings


@click.command(
    "api",
    short_help="Serve the HTTP API for producers (NOTIFIER_API_PORT, 8030).",
    help="Serve the HTTP API: producers write, read and cancel notifications with an API key"
    " (notifier api-key create). Put a TLS-terminating proxy in front of it. Runs until"
    " stopped. The OpenAPI document is served at /openapi.json (docs/openapi.json).",
)
@click.option("--port", type=int, metavar="PORT", help="[default: NOTIFIER_API_PORT, 8030]")
@click.option(
    "--host",
    default="0.0.0.0",  # noqa: S104
    metavar="ADDRESS",
    help="Address to listen on; 127.0.0.1 for this machine only.",
)
@click.option("--workers", type=click.IntRange(1, 64), default=1, help="Processes to serve with.")
@click.option(
    "--print-openapi", is_flag=True, help="Print the OpenAPI document and exit (nothing served)."
)
def serve(port: int | None, host: str, workers: int, print_openapi: bool) -> int:
    if print_openapi:
        sys.stdout.write(json.dumps(openapi.document(), indent=2) + "\n")
        return 0
    import uvicorn

    settings = get_settings()
    logs.configure(settings)
    uvicorn.run(
        "notifier.cli.api:application",
        factory=True,
        host=host,
        port=port or settings.api_port,
        workers=workers,
        proxy_headers=False,
        access_log=False,  # the app logs each request without keys, queries or addresses
        log_config=None,
        timeout_keep_alive=5,
    )
    return 0


def application() -> object:
    """The app of one serving process (uvicorn's factory)."""
    from notifier.api.app import create_app
    from notifier.delivery.intake import intake_for

    settings = get_settings()
    logs.configure(settings)
    counter = redis_access.client(settings, timeout=2)
    engine = db.make_engine(
        settings.database_url,
        pool_size=settings.api_pool_size,
        overflow=0,
        statement_timeout=settings.api_statement_timeout_seconds,
        pooled=settings.transaction_pooled,
    )
    app = create_app(settings, engine, counter)
    # The providers' checks every written row passes, loaded now: a provider that cannot load
    # stops the process at its start, and no first request waits for them (0.3 s here).
    intake_for(settings)
    # What is loaded now lives as long as the process: kept out of the collector's full
    # passes, which a batch's thousands of objects otherwise set off (about a tenth of its time).
    gc.freeze()
    return app


@click.group(
    "api-key",
    cls=Group,
    short_help="Make, list and revoke keys of the HTTP API.",
    help="Keys of notifier api. A key is shown once, when it is made, and stored as a hash;"
    " its NAME is the producer its rows carry.",
)
def api_key() -> None:
    pass


@api_key.command(
    "create",
    short_help="Make a key; it is printed once.",
    help="Make a key for the producer NAME (1-64 of a-z 0-9 _ . -), which every row it writes"
    " carries. It is printed once and stored as a hash: store it now.\n\n\b\nExample:\n"
    "  notifier api-key create billing --channel email --category billing",
)
@click.argument("name")
@click.option("--channel", "channels", multiple=True, help="A channel it may write (repeat).")
@click.option("--category", "categories", multiple=True, help="A category it may write.")
@click.option("--read-only", is_flag=True, help="It may read and nothing else.")
@click.option("--per-second", type=click.IntRange(1), help="Its own rate limit.")
@output.json_option
def create(
    name: str,
    channels: tuple[str, ...],
    categories: tuple[str, ...],
    read_only: bool,
    per_second: int | None,
) -> int:
    try:
        made = keys.make(
            name,
            channels=channels or None,
            categories=categories or None,
            read_only=read_only,
            per_second=per_second,
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="NAME") from None
    with db.engine().begin() as conn:
        api_db.create_key(conn, made.row)
    output.emit(
        {"key": made.key, "prefix": made.row.prefix, "name": name},
        Text(f"{made.key}\n(shown once: store it now; its prefix is {made.row.prefix})"),
    )
    return 0


@api_key.command(
    "list",
    short_help="Every key, without its secret.",
    help="Every key: its prefix, name, scope, and when it was made and revoked.",
)
@output.json_option
def list_keys() -> int:
    with db.engine().connect() as conn:
        found = api_db.keys(conn)
    output.emit(
        [
            {
                "prefix": k.prefix,
                "name": k.name,
                "channels": k.channels,
                "categories": k.categories,
                "read_only": k.read_only,
                "per_second": k.per_second,
                "created_at": k.created_at,
                "revoked_at": k.revoked_at,
            }
            for k in found
        ],
        Table(
            ["PREFIX", "NAME", "SCOPE", "CREATED", "REVOKED"],
            [
                (
                    k.prefix,
                    k.name,
                    _scope(k),
                    f"{k.created_at:%Y-%m-%d %H:%M}" if k.created_at else "",
                    f"{k.revoked_at:%Y-%m-%d %H:%M}" if k.revoked_at else "",
                )
                for k in found
            ],
        ),
    )
    return 0


@api_key.command(
    "revoke",
    short_help="Revoke a key by its prefix, at once.",
    help="Revoke the key whose prefix is PREFIX (nk_ and 10 characters, as listed): its next"
    " request is refused.",
)
@click.argument("prefix")
@output.json_option
def revoke(prefix: str) -> int:
    with db.engine().begin() as conn:
        done = api_db.revoke_key(conn, prefix)
    if not done:
        output.emit({"revoked": None}, Text(f"no live key {output.quoted(prefix)}"))
        return NOTHING_MATCHED
    output.emit({"revoked": prefix}, Text(f"revoked {prefix}"))
    return 0


def _scope(k: api_db.KeyRow) -> str:
    parts = ["read-only"] if k.read_only else []
    if k.channels:
        parts.append("channels " + ",".join(k.channels))
    if k.categories:
        parts.append("categories " + ",".join(k.categories))
    if k.per_second:
        parts.append(f"{k.per_second}/s")
    return "; ".join(parts) or "all"


COMMANDS = (serve, api_key)
