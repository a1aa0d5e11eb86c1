"""The console's web application: Starlette, served by uvicorn, pages rendered by Jinja2.

Every request must name one of the console's hosts (``gate``), or gets 400 before anything
else; every page needs a login; every POST needs the session's CSRF token (and, when the
browser sends an ``Origin``, the console's own: scheme, host and port); actions need the
``admin`` role. Paths built from a name or a value are percent-encoded, one segment each
(the ``segment`` filter in templates, the ``segment`` convertor in routes). Responses forbid
framing, inline scripts and caching (a Content-Security-Policy of ``'self'`` only: row text
that slipped past escaping still could not run). The access log written here names the
method, the path without its query string, the status and the time taken; uvicorn's own, which
prints query strings, is off.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, unquote

from jinja2 import Environment, PackageLoader, select_autoescape
from sqlalchemy import Engine
from starlette.convertors import Convertor, register_url_convertor
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from notifier.console.auth import Session, Sessions, csrf_ok
from notifier.console.gate import WRONG_HOST, Gate, route_path
from notifier.console.limits import Attempts
from notifier.logs import mask_recipient
from notifier.specs import Role, User

log = logging.getLogger("notifier.console")

COOKIE = "notifier_console"
LOGIN_COOKIE = "notifier_console_login"
#: The largest form the console reads (a template preview's sample payload is the biggest).
MAX_FORM_BYTES = 256 * 1024
#: The longest value of one form field (UTF-8): a name, an address, a reason. Two of them still
#: fit one index entry (a suppression's channel and recipient); ``LONG_FIELDS`` may fill the form.
MAX_FIELD_BYTES = 1000
LONG_FIELDS = frozenset({"payload", "ids"})

HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
        b" connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    # Not no-referrer: under it Chromium sends "Origin: null" with same-origin form posts.
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]


def segment(value: object) -> str:
    """``value`` as one path segment: ``/``, ``.``-free of meaning, nothing left unescaped."""
    return quote(str(value), safe="")


class Segment(Convertor[str]):
    """A route's ``{name:segment}``: one segment, decoded (``gate.route_path`` kept it
    encoded)."""

    regex = "[^/]+"

    def convert(self, value: str) -> str:
        return unquote(value)

    def to_string(self, value: str) -> str:
        return segment(value)


register_url_convertor("segment", Segment())


@dataclass
class Console:
    """What every request handler needs."""

    engine: Engine
    users: dict[str, User]
    sessions: Sessions
    secure_cookie: bool
    gate: Gate
    attempts: Attempts
    flower_url: str = ""
    #: keys the tag of a masked recipient (``masked``); this process's own, like its sessions
    mask_key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    env: Environment = field(init=False)
    #: the overview's counts by status and channel, and when they were read (a full count of
    #: a large table is too slow to run at every poll)
    counts_cache: tuple[float, list[tuple[str, str, int]]] = (0.0, [])

    def __post_init__(self) -> None:
        self.env = Environment(
            loader=PackageLoader("notifier.console", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
        )
        self.env.filters["mask"] = self.masked
        self.env.filters["segment"] = segment

    def masked(self, recipient: str | None) -> str:
        """``mask_recipient``'s form and a tag of the whole recipient, ``u***@example.com
        #3f2a``: rows to different people of one domain read apart, one person reads the same
        on every page. The tag is four hex digits of an HMAC under this process's own random
        key: it confirms no guess of the address to anyone outside, and changes when the
        console restarts."""
        if not recipient:
            return ""
        tag = hmac.new(self.mask_key, recipient.encode(), hashlib.sha256).hexdigest()[:4]
        return f"{mask_recipient(recipient)} #{tag}"


def console(request: Request) -> Console:
    c: Console = request.app.state.console
    return c


def session(request: Request) -> Session | None:
    return console(request).sessions.get(request.cookies.get(COOKIE))


def render(request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    s = session(request)
    c = console(request)
    html = c.env.get_template(template).render(
        session=s,
        csrf=s.csrf if s else "",
        is_admin=s is not None and s.role is Role.admin,
        flower_url=c.flower_url,
        path=request.url.path,
        **context,
    )
    return HTMLResponse(html, status_code=status_code)


class Refused(Exception):
    """What the console answers a request it will not act on, before any handler runs: the
    refusal page with ``status`` and the one-line ``reason`` (see ``refused``)."""

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


TOO_LARGE = f"the form is larger than the console reads ({MAX_FORM_BYTES // 1024} KiB)"


def check_length(request: Request) -> None:
    """Refuse (413) a body that says it is over ``MAX_FORM_BYTES``, before reading any of it."""
    length = request.headers.get("content-length", "")
    if length.isascii() and length.isdigit() and int(length) > MAX_FORM_BYTES:
        raise Refused(TOO_LARGE, 413)


def check_inputs(request: Request) -> None:
    """Refuse (400) a NUL character in the path or the query string: no name or filter holds
    one, and PostgreSQL's text cannot."""
    for name, value in [*request.path_params.items(), *request.query_params.multi_items()]:
        _no_nul(name, str(value))


def _no_nul(name: str, value: str) -> None:
    if "\x00" in name or "\x00" in value:
        raise Refused(f"{name[:40]!r} contains a NUL character: remove it")


async def form(request: Request) -> dict[str, str]:
    """The POSTed urlencoded form, first value of each field; ``Refused`` for a body over
    ``MAX_FORM_BYTES`` (413, read no further), a NUL character or a field over
    ``MAX_FIELD_BYTES`` (400)."""
    check_length(request)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise Refused(TOO_LARGE, 413)
    pairs = parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
    for name, value in pairs:
        _no_nul(name, value)
        if name not in LONG_FIELDS and len(value.encode()) > MAX_FIELD_BYTES:
            raise Refused(f"{name[:40]!r} is too long (at most {MAX_FIELD_BYTES} bytes)")
    return dict(reversed(pairs))


Handler = Callable[[Request], Awaitable[Response]]


def page(handler: Handler) -> Handler:
    """A page a logged-in user may see: without a login, to the login page."""

    async def run(request: Request) -> Response:
        if session(request) is None:
            return RedirectResponse("/login", status_code=303)
        check_inputs(request)
        return await handler(request)

    return run


def _same_origin(request: Request) -> bool:
    origins = request.headers.getlist("origin")
    if len(origins) > 1:
        return False
    return console(request).gate.origin_ok(origins[0] if origins else None, request.url.scheme)


FormHandler = Callable[[Request, dict[str, str]], Awaitable[Response]]


def post(*, admin: bool) -> Callable[[FormHandler], Handler]:
    """A form handler: login, CSRF token and origin checked, and with ``admin`` the role;
    refused with 403 otherwise. The handler gets the form."""

    def wrap(handler: FormHandler) -> Handler:
        async def run(request: Request) -> Response:
            check_length(request)
            s = session(request)
            if s is None:
                return refuse(request, "log in first", 403)
            check_inputs(request)
            values = await form(request)
            if not csrf_ok(s, values.get("csrf")) or not _same_origin(request):
                return refuse(request, "the form's security token is missing or stale", 403)
            if admin and s.role is not Role.admin:
                log.warning("console %s was refused %s (viewer)", s.user, request.url.path)
                return refuse(request, "your role may look but not act", 403)
            response: Response = await handler(request, values)
            return response

        return run

    return wrap


def refuse(request: Request, why: str, status_code: int) -> HTMLResponse:
    return render(request, "refused.html", status_code=status_code, why=why)


def client(request: Request) -> str:
    """The client's address, as the gate determined it."""
    return request.client.host if request.client else "unknown"


async def refused(request: Request, exc: Exception) -> Response:
    """The answer to ``Refused``, wherever a handler raised it."""
    assert isinstance(exc, Refused)
    return refuse(request, exc.reason, exc.status)


class Guard:
    """ASGI middleware: the gate (the client, the scheme, the host, the path the routes see),
    security headers on every response, and the access log."""

    def __init__(self, app: ASGIApp, gate: Gate) -> None:
        self.app = app
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        status = 500
        peer = scope.get("client") or ("unknown", 0)
        address, scheme = self.gate.front(str(peer[0]), scope["headers"])
        raw = scope.get("raw_path") or scope["path"].encode()
        scope = {**scope, "client": (address, 0), "scheme": scheme, "path": route_path(raw)}

        async def send_with_headers(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), *HEADERS]
            await send(message)

        try:
            if self.gate.host_ok(scope["headers"], scheme):
                await self.app(scope, receive, send_with_headers)
            else:  # before anything else: no session, no form, no route
                wrong = Response(WRONG_HOST, 400, media_type="text/plain")
                await wrong(scope, receive, send_with_headers)
        finally:
            log.info(
                "console %s %s %d %.0fms",
                scope["method"],
                scope["path"],
                status,
                (time.monotonic() - started) * 1000,
                extra={"event": "console_request", "status": status},
            )
