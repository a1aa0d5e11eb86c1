"""The events endpoint: providers' delivery webhooks and one-click unsubscribes, on Starlette.

Routes (give each provider its URL under ``NOTIFIER_EVENTS_PUBLIC_URL``):

* ``POST /ses`` - Amazon SES through an SNS HTTPS subscription (``notifier.events.sns``)
* ``POST /sendgrid`` - SendGrid's signed Event Webhook
* ``POST /mailgun`` - Mailgun's webhooks
* ``POST /postmark`` - Postmark's webhooks, credentials in the URL
* ``POST /twilio`` - Twilio status callbacks and incoming messages (STOP)
* ``GET /u/{token}`` - a page with one button; ``POST /u/{token}`` - RFC 8058 one-click
* ``GET /health`` - ``ok``

A request is verified before anything in it is read for meaning, by the cheapest check that can
refuse it first: what the headers alone show before the body is read (``Check``), shapes,
timestamps and the SNS topic before any signature, and the signature before anything is
fetched or written (each provider's module lists its order). One that is not (no or wrong
signature or credentials, a stale timestamp, a replayed token, an unknown SNS topic) is answered
401 or 403, a malformed one 400 with the reason, and applied not at all; each refusal is logged
with its reason and counted in Redis (``notifier:metrics:events``, field ``provider|outcome``:
``refused``, ``applied``, ``unmatched``, ``unchanged``), beside the workers' metrics.
Verification and database work run in Starlette's thread pool: the database layer is
synchronous.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import redis
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Route

from notifier import metrics, unsubscribe
from notifier.events import mailgun, postmark, sendgrid, sns, twilio
from notifier.events.model import Event, Refused, parse_json
from notifier.events.state import Applier
from notifier.settings import Settings

log = logging.getLogger(__name__)

COUNTS_KEY = metrics.EVENTS_KEY
#: Largest body read: providers batch events, SendGrid up to about a thousand per request.
MAX_BODY_BYTES = 4 * 1024 * 1024

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
                outcome = (
                    "unmatched" if r.row_id is None else "applied" if r.advanced else "unchanged"
                )
                count(provider, outcome)
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
        if request.method == "GET":  # a link checker's GET must not unsubscribe anybody
            button = '<form method="post"><button type="submit">Unsubscribe</button></form>'
            shown = html.escape(found.recipient)
            return HTMLResponse(_page(f"Stop these messages to {shown}?{button}"))
        what = f", {found.category}" if found.category else ""
        event = Event(
            provider="unsubscribe",
            channel=found.channel,
            at=_now(),
            recipient=found.recipient,
            suppress=f"unsubscribed (one-click{what})",
        )
        await run_in_threadpool(applier.apply, event)
        count("unsubscribe", "applied")
        return HTMLResponse(_page("You are unsubscribed."))

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
        Route("/health", health, methods=["GET"]),
    ]
    return Starlette(routes=routes)


async def _body(request: Request) -> bytes | None:
    """The request's body, or ``None`` past ``MAX_BODY_BYTES`` (read no further)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _subscription(settings: Settings, token: str) -> unsubscribe.Subscription | None:
    secret = settings.unsubscribe_secret
    return unsubscribe.read_token(secret, token) if secret else None


def _now() -> datetime:
    return datetime.now(UTC)


def _page(text: str) -> str:
    return (
        '<!doctype html><html><head><meta charset="utf-8"><title>Unsubscribe</title></head>'
        f"<body><p>{text}</p></body></html>"
    )
