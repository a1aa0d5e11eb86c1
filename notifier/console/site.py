"""The console assembled: its pages and actions behind the guard of ``notifier.console.app``.

Apart from ``app``, so that the pages and actions import the framework they are written
against and nothing imports them back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Engine
from starlette.applications import Starlette
from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles

from notifier.console import actions, exports, keys, pages, people
from notifier.console.app import Console, Guard, Refused, refused
from notifier.console.auth import Sessions
from notifier.console.gate import Gate
from notifier.console.limits import Attempts
from notifier.specs import User


def create_app(
    engine: Engine,
    users: dict[str, User],
    *,
    secure_cookie: bool = True,
    session_seconds: float = 8 * 3600,
    flower_url: str = "",
    gate: Gate | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Starlette:
    """The console for ``users`` over ``engine``; refuses to exist without users.

    ``gate`` says which hosts it answers for (by default loopback on port 8090), ``clock``
    times the limits on password guesses."""
    if not users:
        raise ValueError(
            "the console has no users: set NOTIFIER_CONSOLE_USERS (hashes from"
            " notifier console hash-password)"
        )
    routes: list[BaseRoute] = [
        *pages.routes(),
        *exports.routes(),
        *actions.routes(),
        *people.routes(),
        *keys.routes(),
        Mount("/static", StaticFiles(directory=Path(__file__).parent / "static"), name="static"),
    ]
    gate = gate or Gate.loopback(8090)
    app = Starlette(routes=routes, exception_handlers={Refused: refused})
    # A redirect to the path with(out) a trailing slash would name the request's host.
    app.router.redirect_slashes = False
    app.state.console = Console(
        engine,
        users,
        Sessions(session_seconds),
        secure_cookie,
        gate,
        Attempts(users, clock=clock),
        flower_url,
    )
    app.add_middleware(Guard, gate=gate)
    return app
