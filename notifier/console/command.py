"""``notifier console`` (serve the console) and ``notifier console hash-password``.

Only argparse here at import: the ``notifier`` command loads this for every subcommand, and
the web stack is imported when the console actually starts.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "console",
        help="serve the operators' web console (NOTIFIER_CONSOLE_*), or hash a password for it",
        description="Serve the console on NOTIFIER_CONSOLE_HOST:NOTIFIER_CONSOLE_PORT "
        "(127.0.0.1:8090); it refuses to start without NOTIFIER_CONSOLE_USERS. "
        "'hash-password' reads a password (from the terminal, or one line of stdin) and "
        "prints the hash to put in NOTIFIER_CONSOLE_USERS as name:HASH:role.",
    )
    p.add_argument("action", nargs="?", choices=["serve", "hash-password"], default="serve")
    p.add_argument("--host", help="address to listen on (default: NOTIFIER_CONSOLE_HOST)")
    p.add_argument("--port", type=int, help="port (default: NOTIFIER_CONSOLE_PORT)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from notifier.console.auth import hash_password

    if args.action == "hash-password":
        if sys.stdin.isatty():
            password = getpass.getpass("password: ")
            if getpass.getpass("again: ") != password:
                print("notifier: the passwords differ", file=sys.stderr)
                return 2
        else:
            password = sys.stdin.readline().rstrip("\r\n")
        print(hash_password(password))
        return 0
    return serve(args.host, args.port)


def serve(host: str | None = None, port: int | None = None) -> int:
    import uvicorn

    from notifier import db
    from notifier.console.site import create_app
    from notifier.settings import get_settings
    from notifier.specs import parse_users

    settings = get_settings()
    app = create_app(
        db.make_engine(settings.database_url),
        parse_users(settings.console_users),
        secure_cookie=settings.console_secure_cookie,
        session_seconds=settings.console_session_minutes * 60,
        flower_url=settings.console_flower_url,
    )
    uvicorn.run(
        app,
        host=host or settings.console_host,
        port=port or settings.console_port,
        # Its access log prints query strings; the console writes its own without them.
        access_log=False,
        log_config=None,
        server_header=False,
        proxy_headers=True,
    )
    return 0
