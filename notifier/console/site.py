"""The console assembled: its pages and actions behind the guard of ``notifier.console.app``.

Apart from ``app``, so that the pages and actions import the framework they are written
against and nothing imports them back.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine
from starlette.applications import Starlette
from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles

from notifier.console import actions, pages
from notifier.console.app import Console, Guard, Refused, refused
from notifier.console.auth import Sessions
from notifier.specs import User


def create_app(
    engine: Engine,
    users: dict[str, User],
    *,
    secure_cookie: bool = True,
    session_seconds: float = 8 * 3600,
    flower_url: str = "",
) -> Starlette:
    """The console for ``users`` over ``engine``; refuses to exist without users."""
    if not users:
        raise ValueError(
            "the console has no users: set NOTIFIER_CONSOLE_USERS (hashes from"
            " notifier console hash-password)"
        )
    routes: list[BaseRoute] = [
        *pages.routes(),
        *actions.routes(),
        Mount("/static", StaticFiles(directory=Path(__file__).parent / "static"), name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers={Refused: refused})
    app.state.console = Console(engine, users, Sessions(session_seconds), secure_cookie, flower_url)
    app.add_middleware(Guard)
    return app
