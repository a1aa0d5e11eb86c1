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
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from datetime import UTC, datetime
from typing import Any

import redis

from notifier.events.model import (
    DeliveryStatus,
    Event,
    Refused,
    obj,
    parse_json,
    row_id,
    text_or_none,
)
from notifier.settings import Settings

TOKEN_KEY = "notifier:events:mailgun-token:"  # noqa: S105 - a Redis key prefix
_MESSAGE_ID = re.compile(r"notification-(\d{1,18})@")


def parse(body: bytes) -> dict[str, Any]:
    return parse_json(body, "Mailgun", dict)


def verify(doc: dict[str, Any], settings: Settings, client: redis.Redis) -> None:
    """Raise ``Refused`` unless Mailgun signed ``doc`` recently, and for the first time."""
    if not settings.mailgun_signing_key:
        raise Refused(403, "NOTIFIER_MAILGUN_SIGNING_KEY is not set")
    signed = doc.get("signature")
    if not isinstance(signed, dict):
        raise Refused(401, "Mailgun signature missing")
    stamp, token, signature = (str(signed.get(k, "")) for k in ("timestamp", "token", "signature"))
    expected = hmac.new(
        settings.mailgun_signing_key.encode(), (stamp + token).encode(), hashlib.sha256
    ).hexdigest()
    if not token or not hmac.compare_digest(expected, signature):
        raise Refused(403, "Mailgun signature does not verify")
    max_age = settings.events_max_age_seconds
    if not stamp.isdigit() or abs(time.time() - int(stamp)) > max_age:
        raise Refused(403, "Mailgun timestamp is stale")
    # Kept a little longer than a timestamp stays fresh, so a replay cannot outlive it.
    if not client.set(TOKEN_KEY + token[:200], 1, nx=True, ex=int(max_age) * 2 + 1):
        raise Refused(403, "Mailgun token replayed")


def events(doc: dict[str, Any]) -> list[Event]:
    data = doc.get("event-data")
    if not isinstance(data, dict):
        raise Refused(400, "Mailgun body has no event-data")
    kind = data.get("event")
    variables = obj(data.get("user-variables"))
    headers = obj(obj(data.get("message")).get("headers"))
    found = _MESSAGE_ID.search(str(headers.get("message-id") or ""))
    stamp = data.get("timestamp")
    if not isinstance(stamp, int | float) or isinstance(stamp, bool):
        raise Refused(400, "Mailgun event without a Unix timestamp")
    status = obj(data.get("delivery-status"))
    said = f"{status.get('code', '')} {status.get('message') or status.get('description') or ''}"
    base: dict[str, Any] = {
        "provider": "mailgun",
        "channel": "email",
        "at": datetime.fromtimestamp(stamp, UTC),
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
