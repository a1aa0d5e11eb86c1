"""Mailgun's webhooks, verified as Mailgun documents ("Securing webhooks").

The JSON body holds ``signature``: ``{"timestamp", "token", "signature"}``, the last being the
hex HMAC-SHA256 of ``timestamp + token`` under the webhook signing key
(``NOTIFIER_MAILGUN_SIGNING_KEY``). A timestamp older than ``NOTIFIER_EVENTS_MAX_AGE_SECONDS``
is refused, and so is a token seen before: each is remembered in Redis (``SET NX`` with that
age as its lifetime) under ``notifier:events:mailgun-token:``.

``event-data`` is one event: ``delivered``, ``failed`` (``severity`` ``permanent`` is a hard
bounce; ``temporary`` is a soft bounce that Mailgun tries again, so it is counted but leaves
the row's state alone), ``complained``, ``unsubscribed``; with ``recipient``,
``timestamp`` (Unix seconds), ``user-variables`` (what notifier put in ``X-Mailgun-Variables``:
``notifier_id``) and ``message.headers.message-id``.

Order of checks, cheapest first, nothing written before the last: the key is configured
(403); the body is a JSON object of bounded depth (400); ``signature`` is an object of a
timestamp, a token of at most 200 characters and 64 hex digits (401/403); the timestamp is
Unix seconds within the age (403); the HMAC (403); ``event-data`` reads as a report, its
``timestamp`` a finite Unix time (400); then the token is spent (``spend``: 403 if it was
already, 503 if Redis cannot say).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Any

import redis

from notifier.events.model import (
    DeliveryStatus,
    Event,
    Refused,
    fresh_seconds,
    obj,
    parse_json,
    row_id,
    text_or_none,
    unix_time,
)
from notifier.settings import Settings

TOKEN_KEY = "notifier:events:mailgun-token:"  # noqa: S105 - a Redis key prefix
_MESSAGE_ID = re.compile(r"notification-(\d{1,18})@")
_TOKEN = re.compile(r"[!-~]{1,200}")  # printable ASCII
_HEX_MAC = re.compile(r"[0-9a-f]{64}")


def parse(body: bytes) -> dict[str, Any]:
    return parse_json(body, "Mailgun", dict)


def verify(doc: dict[str, Any], settings: Settings) -> None:
    """Raise ``Refused`` unless Mailgun signed ``doc`` recently; writes nothing (``spend``)."""
    if not settings.mailgun_signing_key:
        raise Refused(403, "NOTIFIER_MAILGUN_SIGNING_KEY is not set")
    signed = doc.get("signature")
    if not isinstance(signed, dict):
        raise Refused(401, "Mailgun signature missing")
    token, signature = signed.get("token"), signed.get("signature")
    if not isinstance(token, str) or not _TOKEN.fullmatch(token):
        raise Refused(403, "Mailgun token is not up to 200 printable characters")
    if not isinstance(signature, str) or not _HEX_MAC.fullmatch(signature):
        raise Refused(403, "Mailgun signature is not 64 hex digits")
    stamp = fresh_seconds(signed.get("timestamp"), settings.events_max_age_seconds, "Mailgun")
    expected = hmac.new(
        settings.mailgun_signing_key.encode(), (stamp + token).encode(), hashlib.sha256
    ).hexdigest()
    if not hmac.compare_digest(expected, signature):
        raise Refused(403, "Mailgun signature does not verify")


def spend(doc: dict[str, Any], settings: Settings, client: redis.Redis) -> None:
    """Remember a verified request's token; ``Refused`` if it was seen before."""
    token = obj(doc.get("signature")).get("token")
    # Kept a little longer than a timestamp stays fresh, so a replay cannot outlive it.
    lifetime = int(settings.events_max_age_seconds) * 2 + 1
    try:
        first = client.set(TOKEN_KEY + str(token), 1, nx=True, ex=lifetime)
    except redis.RedisError:
        raise Refused(503, "Mailgun token not checked: Redis unavailable") from None
    if not first:
        raise Refused(403, "Mailgun token replayed")


def events(doc: dict[str, Any]) -> list[Event]:
    data = doc.get("event-data")
    if not isinstance(data, dict):
        raise Refused(400, "Mailgun body has no event-data")
    kind = data.get("event")
    variables = obj(data.get("user-variables"))
    headers = obj(obj(data.get("message")).get("headers"))
    found = _MESSAGE_ID.search(str(headers.get("message-id") or ""))
    status = obj(data.get("delivery-status"))
    said = f"{status.get('code', '')} {status.get('message') or status.get('description') or ''}"
    base: dict[str, Any] = {
        "provider": "mailgun",
        "channel": "email",
        "at": unix_time(data.get("timestamp"), "Mailgun event timestamp"),
        "recipient": text_or_none(data.get("recipient")),
        "notification_id": row_id(variables.get("notifier_id"))
        or (int(found[1]) if found else None),
        "provider_message_id": text_or_none(headers.get("message-id")),
    }
    if kind == "delivered":
        return [Event(status=DeliveryStatus.delivered, detail=said.strip() or kind, **base)]
    if kind == "failed":
        hard = data.get("severity") == "permanent"
        detail = f"{'hard' if hard else 'soft'} bounce: {said.strip()}".strip(": ")
        return [
            Event(
                status=DeliveryStatus.bounced if hard else None,
                detail=detail,
                suppress=f"hard bounce (mailgun: {said.strip()})" if hard else None,
                soft_bounce=not hard,
                **base,
            )
        ]
    if kind == "complained":
        return [
            Event(
                status=DeliveryStatus.complained,
                detail="complaint",
                suppress="complaint (mailgun)",
                **base,
            )
        ]
    if kind == "unsubscribed":
        return [Event(suppress="unsubscribed (mailgun)", **base)]
    return []
