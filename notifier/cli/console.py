"""``notifier console`` (serve the console) and ``notifier console hash-password``.

Only click here at import: the ``notifier`` command loads this for every subcommand, and the
web stack is imported when the console actually starts.
"""

from __future__ import annotations

import getpass
import sys

import click

from notifier.cli import output
from notifier.cli.base import BAD_USAGE, Command
from notifier.cli.output import Text


@click.command(
    "console",
    cls=Command,
    short_help="Serve the operators' web console, or hash a password for it.",
    help="Serve the operators' web console on NOTIFIER_CONSOLE_HOST:NOTIFIER_CONSOLE_PORT"
    " (127.0.0.1:8090). It refuses to start without NOTIFIER_CONSOLE_USERS"
    " (name:HASH:role,...; roles admin and viewer). Keep it on loopback and reach it through"
    " an SSH tunnel or a TLS-terminating proxy. It answers only for the hosts in"
    " NOTIFIER_CONSOLE_HOSTS (default: 127.0.0.1, localhost and [::1] on its port).\n\n"
    "'hash-password' reads a password (twice from a terminal, or one line of stdin) and prints"
    " the hash to put in NOTIFIER_CONSOLE_USERS.\n\n"
    "\b\nExamples:\n"
    "  notifier console hash-password\n"
    "  echo 'pw' | notifier console hash-password\n"
    "  notifier console --port 8090",
)
@click.argument(
    "action", type=click.Choice(["serve", "hash-password"]), default="serve", required=False
)
@click.option(
    "--host",
    metavar="ADDRESS",
    help="Address to listen on.  [default: NOTIFIER_CONSOLE_HOST, 127.0.0.1]",
)
@click.option(
    "--port",
    type=int,
    metavar="PORT",
    help="Port to listen on.  [default: NOTIFIER_CONSOLE_PORT, 8090]",
)
@output.json_option
def command(action: str, host: str | None, port: int | None) -> int:
    if action == "hash-password":
        return hash_password()
    return serve(host, port)


def hash_password() -> int:
    from notifier.console.auth import hash_password

    if sys.stdin.isatty():
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            output.error("the passwords differ")
            return BAD_USAGE
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    hashed = hash_password(password)
    output.emit({"hash": hashed}, Text(hashed))
    return 0


def serve(host: str | None = None, port: int | None = None) -> int:
    import uvicorn

    from notifier import db
    from notifier.console.gate import Gate
    from notifier.console.site import create_app
    from notifier.settings import get_settings

    settings = get_settings()
    port = port or settings.console_port
    scheme, proxies = settings.console_scheme, settings.console_trusted_proxies
    if settings.console_hosts:
        gate = Gate(tuple(settings.console_hosts), scheme, tuple(proxies))
    else:
        gate = Gate.loopback(port, scheme, proxies)
    app = create_app(
        db.make_engine(settings.database_url, pooled=settings.transaction_pooled),
        settings.console_users,
        secure_cookie=settings.console_secure_cookie,
        session_seconds=settings.console_session_minutes * 60,
        flower_url=settings.console_flower_url,
        gate=gate,
    )
    uvicorn.run(
        app,
        host=host or settings.console_host,
        port=port,
        # Its access log prints query strings; the console writes its own without them.
        access_log=False,
        log_config=None,
        server_header=False,
        # The gate reads X-Forwarded-* itself, from NOTIFIER_CONSOLE_TRUSTED_PROXIES only.
        proxy_headers=False,
    )
    return 0
