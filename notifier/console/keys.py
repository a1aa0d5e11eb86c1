"""The console's API keys: every key by its prefix (never its secret), and for admins a key
made (shown once, on the page that answers the form, never stored or shown again) or revoked
at once. Each change is logged with the console user."""

from __future__ import annotations

import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from notifier.api import keys
from notifier.console.app import page, post, refuse, render, session
from notifier.console.pages import db
from notifier.db import api as api_db

log = logging.getLogger("notifier.console")


def _listed(value: str) -> list[str] | None:
    found = [part.strip() for part in value.split(",") if part.strip()]
    return found or None


@page
async def listing(request: Request) -> Response:
    found = await db(request, api_db.keys)
    done = request.query_params.get("revoked") == "1"
    return render(request, "keys.html", keys=found, made=None,
                  message="Revoked: its next request is refused." if done else None)  # fmt: skip


@post(admin=True)
async def create(request: Request, values: dict[str, str]) -> Response:
    try:
        made = keys.make(
            values.get("name", "").strip(),
            channels=_listed(values.get("channels", "")),
            categories=_listed(values.get("categories", "")),
            read_only=values.get("read_only") == "on",
        )
    except ValueError as exc:
        return refuse(request, str(exc), 400)

    def store(conn: Any) -> list[api_db.KeyRow]:
        api_db.create_key(conn, made.row)
        return api_db.keys(conn)

    found = await db(request, store, begin=True)
    s = session(request)
    log.info("console %s made API key %s for %s", s.user if s else "?", made.row.prefix,
             made.row.name)  # fmt: skip
    return render(request, "keys.html", keys=found, made=made)  # no-store, as every page


@post(admin=True)
async def revoke(request: Request, values: dict[str, str]) -> Response:
    prefix = str(request.path_params.get("prefix", ""))
    if keys.prefix_of(f"{prefix}.{'x' * 43}") is None:
        return refuse(request, "no such key", 404)
    if not await db(request, lambda conn: api_db.revoke_key(conn, prefix), begin=True):
        return refuse(request, "no live key with that prefix", 404)
    s = session(request)
    log.info("console %s revoked API key %s", s.user if s else "?", prefix)
    return RedirectResponse("/keys?revoked=1", status_code=303)


def routes() -> list[Route]:
    return [
        Route("/keys", listing, methods=["GET"]),
        Route("/keys", create, methods=["POST"]),
        Route("/keys/{prefix}/revoke", revoke, methods=["POST"]),
    ]
