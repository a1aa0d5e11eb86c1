"""Postmark's webhooks, verified by the basic-auth credentials Postmark's webhook URL carries
(``https://user:password@events.example.com/postmark``; Postmark documents no signature, and
recommends basic auth and IP filtering). ``NOTIFIER_POSTMARK_WEBHOOK_AUTH`` is ``user:password``.

The JSON body is one record: ``RecordType`` ``Delivery`` (``DeliveredAt``), ``Bounce``
(``Type``: ``HardBounce``, ``BadEmailAddress``, ``ManuallyDeactivated`` are hard, the rest soft;
``BouncedAt``, ``Email``) or ``SpamComplaint``; each with ``MessageID`` and ``Metadata``, which
carries the ``X-PM-Metadata-notifier-id`` header notifier wrote (``notifier-id``).

Order of checks, cheapest first: the credentials are configured (403), present (401) and
right (403), all before the body is read; then the body is a JSON object of bounded depth, its
times ISO 8601 (400).
"""

from __future__ import annotations

import base64
import binascii
import hmac
from datetime import datetime
from typing import Any

from notifier.events.model import (
    DeliveryStatus,
    Event,
    Refused,
    iso_time,
    obj,
    parse_json,
    row_id,
    text_or_none,
)
from notifier.settings import Settings

HARD = frozenset({"HardBounce", "BadEmailAddress", "ManuallyDeactivated"})


def verify(authorization: str | None, settings: Settings) -> None:
    """Raise ``Refused`` unless the request carries the configured basic-auth credentials."""
    if not settings.postmark_webhook_auth:
        raise Refused(403, "NOTIFIER_POSTMARK_WEBHOOK_AUTH is not set")
    scheme, _, encoded = (authorization or "").partition(" ")
    if scheme.lower() != "basic" or not encoded:
        raise Refused(401, "Postmark credentials missing")
    if len(encoded) > 1024:
        raise Refused(403, "Postmark credentials do not match")
    try:
        given = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise Refused(401, "Postmark credentials unreadable") from None
    if not hmac.compare_digest(given, settings.postmark_webhook_auth.encode()):
        raise Refused(403, "Postmark credentials do not match")


def events(body: bytes) -> list[Event]:
    doc = parse_json(body, "Postmark", dict)
    kind = doc.get("RecordType")
    base: dict[str, Any] = {
        "provider": "postmark",
        "channel": "email",
        "notification_id": row_id(obj(doc.get("Metadata")).get("notifier-id")),
        "provider_message_id": text_or_none(doc.get("MessageID")),
    }
    if kind == "Delivery":
        return [
            Event(
                at=_time(doc.get("DeliveredAt")),
                status=DeliveryStatus.delivered,
                detail=str(doc.get("Details") or "delivered"),
                recipient=text_or_none(doc.get("Recipient")),
                **base,
            )
        ]
    if kind == "Bounce":
        hard = doc.get("Type") in HARD
        said = f"{doc.get('Type')}: {doc.get('Description') or ''}".strip(": ")
        return [
            Event(
                at=_time(doc.get("BouncedAt")),
                status=DeliveryStatus.bounced,
                detail=f"{'hard' if hard else 'soft'} bounce {said}",
                recipient=text_or_none(doc.get("Email")),
                suppress=f"hard bounce (postmark {said})" if hard else None,
                soft_bounce=not hard,
                **base,
            )
        ]
    if kind == "SpamComplaint":
        return [
            Event(
                at=_time(doc.get("BouncedAt")),
                status=DeliveryStatus.complained,
                detail="complaint: SpamComplaint",
                recipient=text_or_none(doc.get("Email")),
                suppress="complaint (postmark SpamComplaint)",
                **base,
            )
        ]
    return []


def _time(value: object) -> datetime:
    return iso_time(value, "Postmark time")
