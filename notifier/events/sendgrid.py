"""SendGrid's Event Webhook, verified as SendGrid documents ("Getting Started with the Event
Webhook Security Features").

The request carries ``X-Twilio-Email-Event-Webhook-Signature``: base64 of an ASN.1 DER ECDSA
signature (P-256, SHA-256) over the ``X-Twilio-Email-Event-Webhook-Timestamp`` header's value
followed by the raw body; the verification key is ``NOTIFIER_SENDGRID_PUBLIC_KEY``, base64 DER
as SendGrid's mail settings show it. A timestamp older than ``NOTIFIER_EVENTS_MAX_AGE_SECONDS``
is refused.

The body is a JSON array of events: ``delivered``, ``bounce`` (``type`` ``bounce`` is hard,
``blocked`` soft), ``dropped``, ``spamreport``, ``unsubscribe``, ``group_unsubscribe``; each
with ``email``, ``timestamp`` (Unix seconds), and the unique arguments notifier put in
``X-SMTPAPI`` (``notifier_id``) as top-level fields.

Order of checks, cheapest first, all but the last two before the body is read
(``check_headers``): the key is configured (403); both headers are present (401); the
timestamp is Unix seconds in ASCII digits within the age (403); the signature is base64 of a
sane length (403); then the signature over the body (403); then the body is a JSON array of
bounded depth, each event's ``timestamp`` a finite Unix time (400).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_der_public_key

from notifier.events.model import (
    DeliveryStatus,
    Event,
    Refused,
    fresh_seconds,
    parse_json,
    row_id,
    text_or_none,
    unix_time,
)
from notifier.settings import Settings

SIGNATURE = "x-twilio-email-event-webhook-signature"
TIMESTAMP = "x-twilio-email-event-webhook-timestamp"
_MAX_SIGNATURE_CHARS = 200  # base64 of a DER P-256 signature is about 96


@lru_cache(maxsize=4)
def _key(encoded: str) -> ec.EllipticCurvePublicKey:
    key = load_der_public_key(base64.b64decode(encoded))
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise ValueError("NOTIFIER_SENDGRID_PUBLIC_KEY is not an ECDSA key")
    return key


def check_headers(headers: Mapping[str, str], settings: Settings) -> tuple[str, bytes]:
    """The timestamp and the signature, or ``Refused`` for all that the headers alone show."""
    if not settings.sendgrid_public_key:
        raise Refused(403, "NOTIFIER_SENDGRID_PUBLIC_KEY is not set")
    signature, stamp = headers.get(SIGNATURE), headers.get(TIMESTAMP)
    if not signature or not stamp:
        raise Refused(401, "SendGrid signature headers missing")
    stamp = fresh_seconds(stamp, settings.events_max_age_seconds, "SendGrid")
    try:
        if len(signature) > _MAX_SIGNATURE_CHARS:
            raise ValueError("too long")
        return stamp, base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        raise Refused(403, "SendGrid signature is not base64 of an ECDSA signature") from None


def verify(body: bytes, headers: Mapping[str, str], settings: Settings) -> None:
    """Raise ``Refused`` unless SendGrid signed ``body`` recently."""
    stamp, raw = check_headers(headers, settings)
    try:
        _key(settings.sendgrid_public_key or "").verify(
            raw, stamp.encode() + body, ec.ECDSA(hashes.SHA256())
        )
    except (InvalidSignature, binascii.Error, ValueError):
        raise Refused(403, "SendGrid signature does not verify") from None


def events(body: bytes) -> list[Event]:
    docs = parse_json(body, "SendGrid", list)
    return [e for doc in docs if isinstance(doc, dict) and (e := _event(doc)) is not None]


def _event(doc: dict[str, Any]) -> Event | None:
    kind, reason = doc.get("event"), str(doc.get("reason") or doc.get("response") or "")
    base: dict[str, Any] = {
        "provider": "sendgrid",
        "channel": "email",
        "at": _time(doc.get("timestamp")),
        "recipient": text_or_none(doc.get("email")),
        "notification_id": row_id(doc.get("notifier_id")),
        "provider_message_id": text_or_none(doc.get("sg_message_id")),
    }
    if kind == "delivered":
        return Event(status=DeliveryStatus.delivered, detail=reason or "delivered", **base)
    if kind == "bounce":
        hard = doc.get("type", "bounce") == "bounce"
        detail = f"{'hard' if hard else 'soft'} bounce: {reason}".strip(": ")
        return Event(
            status=DeliveryStatus.bounced,
            detail=detail,
            suppress=f"hard bounce (sendgrid: {reason})" if hard else None,
            soft_bounce=not hard,
            **base,
        )
    if kind == "dropped":
        return Event(status=DeliveryStatus.undelivered, detail=f"dropped: {reason}", **base)
    if kind == "spamreport":
        return Event(
            status=DeliveryStatus.complained,
            detail="complaint: spamreport",
            suppress="complaint (sendgrid spamreport)",
            **base,
        )
    if kind in ("unsubscribe", "group_unsubscribe"):
        return Event(suppress=f"unsubscribed (sendgrid {kind})", **base)
    return None


def _time(value: object) -> datetime:
    return unix_time(value, "SendGrid event timestamp")
