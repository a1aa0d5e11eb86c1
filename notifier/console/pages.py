"""The console's pages to look at: login, the overview and its live counts, the list, one row."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlencode

from sqlalchemy.exc import OperationalError
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from notifier.console import filters
from notifier.console.app import (
    COOKIE,
    LOGIN_COOKIE,
    client,
    console,
    form,
    page,
    post,
    render,
    session,
)
from notifier.console.auth import authenticate
from notifier.console.limits import retry_after
from notifier.db import listing, rows, stats, workers

log = logging.getLogger("notifier.console")

#: How long the overview's counts by status and channel are reused.
COUNTS_SECONDS = 30.0

T = TypeVar("T")


async def db(request: Request, work: Callable[[Any], T], *, begin: bool = False) -> T:
    """``work(conn)`` on a connection of the console's engine, in a thread: SQL blocks."""
    engine = console(request).engine

    def run() -> T:
        with engine.begin() if begin else engine.connect() as conn:
            return work(conn)

    return await asyncio.to_thread(run)


# --- login --------------------------------------------------------------------------------------


async def login_page(request: Request, error: str | None = None, status: int = 200) -> Response:
    # Login CSRF: the form's token must equal a cookie set with it (SameSite=Strict).
    token = secrets.token_urlsafe(24)
    response = render(request, "login.html", status, login_token=token, error=error)
    _cookie(request, response, LOGIN_COOKIE, token, max_age=3600)
    return response


async def login(request: Request) -> Response:
    values = await form(request)
    cookie = request.cookies.get(LOGIN_COOKIE, "")
    if not cookie or not secrets.compare_digest(cookie, values.get("login_token", "")):
        return await login_page(request, "The login form expired; try again.", 403)
    c = console(request)
    name = values.get("user", "")[:200]
    who = client(request)
    wait = c.attempts.begin(name, who)
    if wait:  # refused before the password is looked at: a refused guess costs no scrypt
        seconds = retry_after(wait)
        response = await login_page(
            request, f"Too many failed logins: try again in {seconds} s.", 429
        )
        response.headers["retry-after"] = str(seconds)
        return response
    user = await asyncio.to_thread(authenticate, c.users, name, values.get("password", ""))
    if user is None:
        log.warning(
            "console login failed for user %s from %s",
            _printable(name),
            who,
            extra={"event": "console_login_failed", "client": who},
        )
        return await login_page(request, "Wrong user name or password.", 401)
    c.attempts.succeeded(name, who)
    token, _ = c.sessions.start(user)
    log.info("console %s logged in (%s)", user.name, user.role)
    response = RedirectResponse("/", status_code=303)
    _cookie(request, response, COOKIE, token, max_age=int(c.sessions.lifetime))
    response.delete_cookie(LOGIN_COOKIE, path="/")
    return response


def _printable(text: str) -> str:
    """``text`` for a log line: newlines, controls and backslashes escaped, so that a user name
    cannot write a line of its own."""
    return text.encode("unicode_escape").decode("ascii")


def _cookie(request: Request, response: Response, name: str, value: str, max_age: int) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path="/",
        httponly=True,
        samesite="strict",
        secure=console(request).secure_cookie,
    )


@post(admin=False)
async def logout(request: Request, _values: dict[str, str]) -> Response:
    console(request).sessions.end(request.cookies.get(COOKIE))
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response


# --- overview -----------------------------------------------------------------------------------


def _counts(request: Request, conn: Any) -> list[tuple[str, str, int]]:
    c = console(request)
    at, counts = c.counts_cache
    if time.monotonic() - at > COUNTS_SECONDS:
        counts = stats.counts(conn)
        c.counts_cache = (time.monotonic(), counts)
    return counts


def _table(counts: list[tuple[str, str, int]]) -> dict[str, Any]:
    channels = sorted({ch for _, ch, _ in counts})
    cells = {(s, ch): n for s, ch, n in counts}
    return {
        "channels": channels,
        "rows": [
            (
                s,
                [cells.get((s, ch), 0) for ch in channels],
                sum(cells.get((s, ch), 0) for ch in channels),
            )
            for s in filters.STATUSES
        ],
    }


def _chart(minutes: list[tuple[Any, int, int]]) -> dict[str, Any]:
    """Bars of an inline SVG, 60 minutes wide."""
    top = max([s + f for _, s, f in minutes] + [1])
    bars = []
    for i, (minute, sent, failed) in enumerate(minutes):
        h_sent, h_failed = 80 * sent / top, 80 * failed / top
        bars.append(
            {
                "x": i * 10,
                "sent_y": 90 - h_sent,
                "sent_h": h_sent,
                "failed_y": 90 - h_sent - h_failed,
                "failed_h": h_failed,
                "title": f"{minute:%H:%M} UTC: {sent} sent, {failed} failed",
            }
        )
    return {"bars": bars, "top": top, "last": minutes[-1][1] if minutes else 0}


def _minutes(conn: Any) -> list[tuple[Any, int, int]]:
    """``(minute, sent, failed)`` over the last hour, oldest first; the last is under way."""
    return [(m, s, r + d) for m, s, r, d in stats.outcomes_per_minute(conn, 59)]


@page
async def overview(request: Request) -> Response:
    def read(conn: Any) -> tuple[Any, ...]:
        return _counts(request, conn), stats.gauges(conn), _minutes(conn), workers.seen(conn)

    counts, gauges, minutes, seen = await db(request, read)
    return render(
        request,
        "overview.html",
        table=_table(counts),
        gauges=gauges,
        chart=_chart(minutes),
        workers=seen,
        sent_last_minute=minutes[-2][1] if len(minutes) > 1 else 0,
    )


async def live(request: Request) -> Response:
    """The overview's numbers, polled by its page."""
    if session(request) is None:
        return JSONResponse({"error": "log in first"}, status_code=401)

    def read(conn: Any) -> dict[str, Any]:
        g = dataclasses.asdict(stats.gauges(conn))
        minutes = _minutes(conn)
        cells = {f"{s}.{ch}": n for s, ch, n in _counts(request, conn)}
        return {
            **{k: (round(v, 1) if isinstance(v, float) else v) for k, v in g.items()},
            "sent_last_minute": int(minutes[-2][1]) if len(minutes) > 1 else 0,
            "counts": cells,
        }

    data = await db(request, read)
    return Response(json.dumps(data, default=str), media_type="application/json")


# --- the list -----------------------------------------------------------------------------------


def _int(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() and len(value) < 19 else None


@page
async def notifications(request: Request) -> Response:
    s = session(request)
    assert s is not None
    query = dict(request.query_params)
    key = query.get("q")
    try:
        public = {k: v for k, v in query.items() if k in filters.PUBLIC}
        f = filters.parse({**public, **filters.recall(s, key)}, private=True)
    except ValueError as exc:
        return render(request, "list.html", 400, rows=[], f=filters.Filters(), error=str(exc))
    before = _int(query.get("before"))

    def read(conn: Any) -> list[dict[str, Any]]:
        params: dict[str, Any] = {**f.params(), "before": before, "limit": listing.PAGE + 1}
        if f.since is not None:
            params["min_id"] = listing.id_at(conn, f.since)
        if f.until is not None:
            params["max_id"] = listing.id_after(conn, f.until)
        return listing.list_rows(conn, params)

    error = None
    try:
        found = await db(request, read, begin=True)
    except OperationalError as exc:
        if "statement timeout" not in str(exc):
            raise
        found, error = (
            [],
            (
                "This search took too long: few rows match over a long stretch. Narrow it with a"
                " time range (since/until) or a campaign."
            ),
        )
    more = len(found) > listing.PAGE
    found = found[: listing.PAGE]
    link = {**f.public(), **({"q": key} if key and f.private() else {})}
    return render(
        request,
        "list.html",
        rows=found,
        f=f,
        error=error,
        link=link,
        next_before=found[-1]["id"] if more else None,
        statuses=filters.STATUSES,
    )


@post(admin=False)
async def search(request: Request, values: dict[str, str]) -> Response:
    """The filter form: personal filters into the session, the rest into the URL."""
    s = session(request)
    assert s is not None
    try:
        f = filters.parse(values, private=True)
    except ValueError as exc:
        return render(request, "list.html", 400, rows=[], f=filters.Filters(), error=str(exc))
    params = f.public()
    if f.private():
        params["q"] = filters.remember(s, f)
    return RedirectResponse(f"/notifications?{urlencode(params)}", status_code=303)


# --- one notification ---------------------------------------------------------------------------


async def show(request: Request, *, revealed: bool = False, message: str | None = None) -> Response:
    row_id = _int(request.path_params.get("id"))
    if row_id is None:
        return render(request, "refused.html", 404, why="no such notification")

    def read(conn: Any) -> tuple[Any, Any]:
        return rows.notification(conn, row_id), rows.history(conn, row_id)

    row, history = await db(request, read)
    if row is None:
        return render(request, "refused.html", 404, why="no such notification")
    payload = json.dumps(row["payload"], indent=2, ensure_ascii=False, sort_keys=True)
    return render(
        request,
        "notification.html",
        n=row,
        history=history,
        payload=payload,
        revealed=revealed,
        message=message,
    )


#: What an action's redirect may say (``?done=``): fixed texts, never text from the URL.
DONE = {
    "requeued": "Requeued.",
    "cancelled": "Cancelled.",
    "unchanged": "Nothing changed: the row was no longer in a state that allows it.",
}


@page
async def notification(request: Request) -> Response:
    return await show(request, message=DONE.get(request.query_params.get("done", "")))


@post(admin=False)
async def reveal(request: Request, _values: dict[str, str]) -> Response:
    s = session(request)
    assert s is not None
    log.info(
        "console %s revealed the recipient of notification %s",
        s.user,
        request.path_params["id"],
        extra={"event": "console_reveal"},
    )
    return await show(request, revealed=True)


def routes() -> list[Route]:
    return [
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/", overview),
        Route("/live.json", live),
        Route("/notifications", notifications, methods=["GET"]),
        Route("/notifications", search, methods=["POST"]),
        Route("/notifications/{id:segment}", notification, methods=["GET"]),
        Route("/notifications/{id:segment}/reveal", reveal, methods=["POST"]),
    ]
