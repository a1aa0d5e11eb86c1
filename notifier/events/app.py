"""The events endpoint: providers' delivery webhooks and one-click unsubscribes, on Starlette.

Routes (give each provider its URL under ``NOTIFIER_EVENTS_PUBLIC_URL``):

* ``POST /ses`` - Amazon SES through an SNS HTTPS subscription (``notifier.events.sns``)
* ``POST /sendgrid`` - SendGrid's signed Event Webhook
* ``POST /mailgun`` - Mailgun's webhooks
* ``POST /postmark`` - Postmark's webhooks, credentials in the URL
* ``POST /twilio`` - Twilio status callbacks and incoming messages (STOP)
* ``GET /u/{token}`` - a page with one button; ``POST /u/{token}`` - RFC 8058 one-click: only
  a body of exactly ``List-Unsubscribe=One-Click``, or the page's own form, opts out; HEAD
  shows the page, other methods are answered 405
* ``GET /p/{token}`` - a person's preference center; ``POST /p/{token}`` - its form, saved
  (``notifier.preference_center``)
* ``GET /health`` - ``ok``

A request is verified before anything in it is read for meaning, by the cheapest check that can
refuse it first: what the headers alone show before the body is read (``Check``), shapes,
timestamps and the SNS topic before any signature, and the signature before anything is
fetched or written (each provider's module lists its order). One that is not (no or wrong
signature or credentials, a stale timestamp, a replayed token, an unknown SNS topic) is answered
401 or 403, a malformed one 400 with the reason, and applied not at all; each refusal is logged
with its reason and counted in Redis (``notifier:metrics:events``, field ``provider|outcome``:
``refused``, ``applied``, ``unmatched``, ``unchanged``, ``mismatched``: a report naming another
recipient than its row's), beside the workers' metrics. No access log line shows a token: ``/u/``
paths are logged as ``/u/…`` (``notifier.logs.redact_access_paths``). Verification and
database work run in Starlette's thread pool: the database layer is synchronous.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Awaitable, Callable
from email import policy
from email.parser import BytesParser
from urllib.parse import parse_qsl

import redis
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Route

from notifier import metrics, preference_center, unsubscribe
from notifier.db import profiles
from notifier.events import mailgun, postmark, sendgrid, sns, twilio
from notifier.events.model import Event, Refused, parse_json
from notifier.events.state import Applier
from notifier.settings import Settings

log = logging.getLogger(__name__)

COUNTS_KEY = metrics.EVENTS_KEY
#: Largest body read: providers batch events, SendGrid up to about a thousand per request.
MAX_BODY_BYTES = 4 * 1024 * 1024
#: Largest unsubscribe form read: the one-click form is 26 bytes, multipart a few hundred.
MAX_FORM_BYTES = 4096
#: Largest preference-center form read: a field per category and channel.
MAX_PREFERENCES_FORM_BYTES = 65_536

Handler = Callable[[bytes, Request], list[Event]]
#: What a request's headers alone show, checked before its body is read: raises ``Refused``.
Check = Callable[[Request], object]


def create_app(settings: Settings, engine: Engine, client: redis.Redis) -> Starlette:
    applier = Applier(engine, client, settings)

    def count(provider: str, outcome: str, n: int = 1) -> None:
        try:
            client.hincrby(COUNTS_KEY, f"{provider}|{outcome}", n)
        except redis.RedisError:
            log.warning("could not count %s %s events: Redis unavailable", n, outcome)

    def receive(
        provider: str, handle: Handler, check: Check | None = None
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                if check is not None:
                    check(request)
                body = await _body(request)
                if body is None:
                    return PlainTextResponse("body too large", status_code=413)
                events = await run_in_threadpool(handle, body, request)
            except Refused as exc:
                log.warning("refused a %s request: %s", provider, exc.reason)
                count(provider, "refused")
                return PlainTextResponse(exc.reason, status_code=exc.status)
            try:
                results = await run_in_threadpool(applier.apply_all, events)
            except (SQLAlchemyError, redis.RedisError):  # the provider will send it again
                log.exception("could not apply %s %s events", len(events), provider)
                return PlainTextResponse("try again later", status_code=503)
            for r in results:
                count(provider, r.outcome)
            return PlainTextResponse("ok")

        return endpoint

    def ses(body: bytes, request: Request) -> list[Event]:
        doc = parse_json(body, "SNS", dict)
        sns.verify(doc, settings)
        kind = doc["Type"]
        if kind == "SubscriptionConfirmation":
            sns.confirm(doc, settings)
            log.info("confirmed the SNS subscription to %s", doc["TopicArn"])
            return []
        return sns.events(doc) if kind == "Notification" else []

    def sendgrid_headers(request: Request) -> object:
        return sendgrid.check_headers(request.headers, settings)

    def sendgrid_events(body: bytes, request: Request) -> list[Event]:
        sendgrid.verify(body, request.headers, settings)
        return sendgrid.events(body)

    def mailgun_events(body: bytes, request: Request) -> list[Event]:
        doc = mailgun.parse(body)
        mailgun.verify(doc, settings)
        found = mailgun.events(doc)
        mailgun.spend(doc, settings, client)
        return found

    def postmark_credentials(request: Request) -> None:
        postmark.verify(request.headers.get("authorization"), settings)

    def postmark_events(body: bytes, request: Request) -> list[Event]:
        return postmark.events(body)

    def twilio_header(request: Request) -> object:
        return twilio.check_header(request.headers.get(twilio.SIGNATURE), settings)

    def twilio_events(body: bytes, request: Request) -> list[Event]:
        params = twilio.parse(body)
        query = request.scope.get("query_string", b"").decode("latin-1")
        given = request.headers.get(twilio.SIGNATURE)
        twilio.verify(request.url.path, query, params, given, settings)
        return twilio.events(params)

    async def unsubscribe_page(request: Request) -> Response:
        found = _subscription(settings, request.path_params["token"])
        if found is None:
            count("unsubscribe", "refused")
            return HTMLResponse(_page("This unsubscribe link is not valid."), status_code=403)
        what = html.escape(found.category or "these")
        if request.method != "POST":  # GET, HEAD: a link checker's must not unsubscribe anybody
            button = (
                '<form method="post"><input type="hidden" name="confirm" value="unsubscribe">'
                '<button type="submit">Unsubscribe</button></form>'
            )
            return HTMLResponse(_page(f"Stop {what} messages to this address?{button}"))
        body = await _body(request, MAX_FORM_BYTES)
        given = None if body is None else _fields(body, request.headers.get("content-type", ""))
        if given not in UNSUBSCRIBE_FORMS:
            count("unsubscribe", "refused")
            return HTMLResponse(_page("Nothing was changed."), status_code=400)
        reason = (
            f"unsubscribed (one-click, {found.category})"
            if found.category
            else ("unsubscribed (one-click)")
        )
        await run_in_threadpool(
            applier.opt_out, found.channel, found.recipient, found.category, reason
        )
        count("unsubscribe", "applied")
        center = unsubscribe.preferences_url(settings, found.profile) if found.profile else None
        more = (
            f' <a href="{html.escape(center)}">Choose what else you receive</a>.' if center else ""
        )
        return HTMLResponse(_page(f"You will get no more {what} messages.{more}"))

    def preferences_text(profile_id: str, saved: preference_center.Choices | None) -> str | None:
        with engine.begin() as conn:
            if saved is not None and profiles.get(conn, profile_id) is not None:
                preference_center.save(conn, profile_id, saved)
            return preference_center.page(settings, conn, profile_id, saved=saved is not None)

    async def preferences_page(request: Request) -> Response:
        secret = settings.unsubscribe_secret
        token = request.path_params["token"]
        found = unsubscribe.read_preferences_token(secret, token) if secret else None
        if found is None or not settings.preference_center:
            count("preferences", "refused")
            return _center(403, "This link is not valid.")
        saved = None
        if request.method == "POST":
            body = await _body(request, MAX_PREFERENCES_FORM_BYTES)
            form = None if body is None else _fields(body, request.headers.get("content-type", ""))
            try:
                if form is None:
                    raise preference_center.Refused("the form is too large or not a form")
                saved = preference_center.choices(settings, form)
            except preference_center.Refused as exc:
                log.info("refused a preference-center form: %s", exc)
                count("preferences", "refused")
                return _center(400, "Nothing was changed.")
        try:
            text = await run_in_threadpool(preferences_text, found, saved)
        except SQLAlchemyError:
            log.exception("could not show or save a preference center")
            return _center(503, "Please try again in a moment.")
        if text is None:
            return _center(404, "There is nothing to set here any more.")
        if saved is not None:
            count("preferences", "applied")
        return HTMLResponse(text, headers=preference_center.HEADERS)

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    routes = [
        Route("/ses", receive("ses", ses), methods=["POST"]),
        Route(
            "/sendgrid",
            receive("sendgrid", sendgrid_events, sendgrid_headers),
            methods=["POST"],
        ),
        Route("/mailgun", receive("mailgun", mailgun_events), methods=["POST"]),
        Route(
            "/postmark",
            receive("postmark", postmark_events, postmark_credentials),
            methods=["POST"],
        ),
        Route("/twilio", receive("twilio", twilio_events, twilio_header), methods=["POST"]),
        Route("/u/{token}", unsubscribe_page, methods=["GET", "POST"]),
        Route("/p/{token}", preferences_page, methods=["GET", "POST"]),
        Route("/health", health, methods=["GET"]),
    ]
    return Starlette(routes=routes)


async def _body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes | None:
    """The request's body, or ``None`` past ``limit`` bytes (read no further)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


#: The bodies that unsubscribe: RFC 8058's one-click POST, and the confirmation page's form.
UNSUBSCRIBE_FORMS = ({"List-Unsubscribe": "One-Click"}, {"confirm": "unsubscribe"})


def _fields(body: bytes, content_type: str) -> dict[str, str] | None:
    """A form's fields, each once, urlencoded or ``multipart/form-data`` (which RFC 8058
    recommends); ``None`` for anything else."""
    pairs: list[tuple[str, str]] = []
    if content_type.lower().startswith("multipart/form-data"):
        header = f"Content-Type: {content_type}\r\n\r\n".encode("latin-1", "replace")
        message = BytesParser(policy=policy.HTTP).parsebytes(header + body)
        if not message.is_multipart():
            return None
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            value = part.get_payload(decode=True)
            if not isinstance(name, str) or not isinstance(value, bytes):
                return None
            pairs.append((name, value.decode("utf-8", "replace")))
    else:
        try:
            text = body.decode("ascii")
            pairs = parse_qsl(text, strict_parsing=True, keep_blank_values=True)
        except (UnicodeDecodeError, ValueError):
            return None
    fields = dict(pairs)
    return fields if len(fields) == len(pairs) else None


def _subscription(settings: Settings, token: str) -> unsubscribe.Subscription | None:
    secret = settings.unsubscribe_secret
    return unsubscribe.read_token(secret, token) if secret else None


def _center(status: int, text: str) -> HTMLResponse:
    body = preference_center.document(text, f"<p>{html.escape(text)}</p>")
    return HTMLResponse(body, status_code=status, headers=preference_center.HEADERS)


def _page(text: str) -> str:
    return (
        '<!doctype html><html><head><meta charset="utf-8"><title>Unsubscribe</title></head>'
        f"<body><p>{text}</p></body></html>"
    )
