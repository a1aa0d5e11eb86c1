"""The console's people: a person's profile, their preferences with who changed each and when,
their latest notifications, and a preference changed on their behalf (recorded as the
operator's, ``source`` ``operator``, and logged with the console user)."""

from __future__ import annotations

import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from notifier.console.app import page, post, refuse, render, segment, session
from notifier.console.pages import db
from notifier.db import profiles
from notifier.specs import parse_category, parse_profile_id

log = logging.getLogger("notifier.console")


def _profile_id(request: Request) -> str | None:
    try:
        return parse_profile_id(str(request.path_params.get("id", "")))
    except ValueError:
        return None


@page
async def people(request: Request) -> Response:
    wanted = request.query_params.get("id", "").strip()
    if wanted:
        return RedirectResponse(f"/people/{segment(wanted)}", status_code=303)
    return render(request, "people.html", person=None)


@page
async def person(request: Request) -> Response:
    profile_id = _profile_id(request)
    if profile_id is None:
        return refuse(request, "no such person", 404)

    def read(conn: Any) -> tuple[Any, ...]:
        return (
            profiles.get(conn, profile_id),
            profiles.preferences(conn, profile_id),
            profiles.history(conn, profile_id, limit=50),
            profiles.recent(conn, profile_id),
        )

    found, chosen, changes, recent = await db(request, read)
    if found is None:
        return refuse(request, "no such person", 404)
    done = request.query_params.get("done") == "1"
    return render(
        request, "people.html", person=found, chosen=chosen, changes=changes, recent=recent,
        message="Saved, as changed by you on their behalf." if done else None,
    )  # fmt: skip


@post(admin=True)
async def prefer(request: Request, values: dict[str, str]) -> Response:
    profile_id = _profile_id(request)
    category, channel = values.get("category", "").strip(), values.get("channel", "").strip()
    state = values.get("state", "")
    try:
        parse_category(category)
    except ValueError as exc:
        return refuse(request, str(exc), 400)
    if profile_id is None or not channel.isidentifier() or state not in ("on", "off"):
        return refuse(request, "give a person, a category, a channel and on or off", 400)

    def work(conn: Any) -> bool:
        if profiles.get(conn, profile_id) is None:
            return False
        profiles.set_preferences(conn, profile_id, {(category, channel): state == "on"}, "operator")
        return True

    if not await db(request, work, begin=True):
        return refuse(request, "no such person", 404)
    s = session(request)
    log.info(
        "console %s turned %s %s on %s for a person", s.user if s else "?", category, state, channel
    )
    return RedirectResponse(f"/people/{segment(profile_id)}?done=1", status_code=303)


def routes() -> list[Route]:
    return [
        Route("/people", people, methods=["GET"]),
        Route("/people/{id:segment}", person, methods=["GET"]),
        Route("/people/{id:segment}/prefer", prefer, methods=["POST"]),
    ]
