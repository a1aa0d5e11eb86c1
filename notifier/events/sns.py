"""Amazon SES notifications through Amazon SNS, verified as AWS documents.

SNS POSTs a JSON document (``Type``: ``Notification``, ``SubscriptionConfirmation`` or
``UnsubscribeConfirmation``). Its ``Signature`` is base64 RSA PKCS#1 v1.5 over the canonical
string: for each of the type's keys in this order, present ones only, ``key "\\n" value "\\n"``::

    Notification:                  Message, MessageId, Subject (if present), Timestamp,
                                   TopicArn, Type
    Subscription/Unsubscribe-      Message, MessageId, SubscribeURL, Timestamp, Token,
    Confirmation:                  TopicArn, Type

with SHA1 for ``SignatureVersion`` 1 and SHA256 for 2 ("Verifying the signatures of Amazon SNS
messages", SNS developer guide). The key is the certificate at ``SigningCertURL``, fetched only
from a URL matching ``NOTIFIER_SNS_CERT_URL_PATTERN`` (AWS's ``https://sns.<region>.amazonaws.com/``)
and only for a ``TopicArn`` listed in ``NOTIFIER_SNS_TOPIC_ARNS``: anyone can make a topic, and
AWS signs its messages too. A subscription is confirmed by fetching its ``SubscribeURL``,
which must match the same pattern.

The ``Message`` of a notification is SES's JSON (``notificationType``, or ``eventType`` for
event publishing): ``Delivery``, ``Bounce`` (``bounceType`` ``Permanent`` is hard,
``Transient`` and ``Undetermined`` soft) or ``Complaint``, with ``mail.headers`` (when the
identity includes original headers: ``X-Notifier-Id``) and ``mail.commonHeaders.messageId``.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import threading
from datetime import datetime
from typing import Any

import httpx
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from notifier.events.model import DeliveryStatus, Event, Refused, obj, row_id, text_or_none
from notifier.settings import Settings

NOTIFICATION_KEYS = ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type")
CONFIRMATION_KEYS = (
    "Message",
    "MessageId",
    "SubscribeURL",
    "Timestamp",
    "Token",
    "TopicArn",
    "Type",
)
_HASHES: dict[str, type[hashes.HashAlgorithm]] = {"1": hashes.SHA1, "2": hashes.SHA256}
_MESSAGE_ID = re.compile(r"<notification-(\d{1,18})@")
_MAX_CERT_BYTES = 65_536

_certs: dict[str, rsa.RSAPublicKey] = {}
_certs_lock = threading.Lock()


def string_to_sign(doc: dict[str, Any]) -> bytes:
    """The canonical string SNS signs for this message's type."""
    keys = NOTIFICATION_KEYS if doc.get("Type") == "Notification" else CONFIRMATION_KEYS
    return "".join(f"{k}\n{doc[k]}\n" for k in keys if isinstance(doc.get(k), str)).encode()


def verify(doc: dict[str, Any], settings: Settings) -> None:
    """Raise ``Refused`` unless ``doc`` is signed by SNS for one of the allowed topics."""
    allowed = {arn.strip() for arn in settings.sns_topic_arns.split(",") if arn.strip()}
    if doc.get("TopicArn") not in allowed:
        raise Refused(403, "SNS topic not in NOTIFIER_SNS_TOPIC_ARNS")
    algorithm = _HASHES.get(str(doc.get("SignatureVersion")))
    if algorithm is None:
        raise Refused(403, "SNS SignatureVersion is neither 1 nor 2")
    url = doc.get("SigningCertURL")
    if not isinstance(url, str) or not re.match(settings.sns_cert_url_pattern, url):
        raise Refused(403, "SNS SigningCertURL is not an allowed SNS host")
    try:
        signature = base64.b64decode(str(doc.get("Signature")), validate=True)
    except (binascii.Error, ValueError):
        raise Refused(403, "SNS Signature is not base64") from None
    key = _certificate_key(url)
    try:
        key.verify(signature, string_to_sign(doc), padding.PKCS1v15(), algorithm())
    except InvalidSignature:
        raise Refused(403, "SNS signature does not verify") from None


def confirm(doc: dict[str, Any], settings: Settings) -> None:
    """Confirm a verified subscription by fetching its SubscribeURL (an allowed host only)."""
    url = doc.get("SubscribeURL")
    if not isinstance(url, str) or not re.match(settings.sns_cert_url_pattern, url):
        raise Refused(403, "SNS SubscribeURL is not an allowed SNS host")
    try:
        httpx.get(url, timeout=10, follow_redirects=False).raise_for_status()
    except httpx.HTTPError as exc:
        raise Refused(502, f"SNS subscription not confirmed: {exc}") from None


def events(doc: dict[str, Any]) -> list[Event]:
    """The SES reports in a verified SNS notification."""
    try:
        message = json.loads(str(doc.get("Message")))
    except json.JSONDecodeError:
        raise Refused(400, "SNS Message is not SES JSON") from None
    if not isinstance(message, dict):
        raise Refused(400, "SNS Message is not SES JSON")
    kind = message.get("notificationType") or message.get("eventType")
    mail = obj(message.get("mail"))
    base: dict[str, Any] = {
        "provider": "ses",
        "channel": "email",
        "notification_id": _notification_id(mail),
        "provider_message_id": text_or_none(mail.get("messageId")),
    }
    if kind == "Delivery":
        delivery = obj(message.get("delivery"))
        return [
            Event(
                at=_time(delivery.get("timestamp")),
                status=DeliveryStatus.delivered,
                detail=str(delivery.get("smtpResponse") or "delivered"),
                recipient=text_or_none(recipient),
                **base,
            )
            for recipient in delivery.get("recipients") or [None]
        ]
    if kind == "Bounce":
        bounce = obj(message.get("bounce"))
        hard = bounce.get("bounceType") == "Permanent"
        what = f"{bounce.get('bounceType')}/{bounce.get('bounceSubType')}"
        found = []
        for entry in bounce.get("bouncedRecipients") or [{}]:
            said = obj(entry).get("diagnosticCode", "")
            detail = f"{'hard' if hard else 'soft'} bounce {what}: {said}"
            found.append(
                Event(
                    at=_time(bounce.get("timestamp")),
                    status=DeliveryStatus.bounced,
                    detail=detail.strip(": "),
                    recipient=text_or_none(obj(entry).get("emailAddress")),
                    suppress=f"hard bounce (ses: {detail})" if hard else None,
                    soft_bounce=not hard,
                    **base,
                )
            )
        return found
    if kind == "Complaint":
        complaint = obj(message.get("complaint"))
        feedback = complaint.get("complaintFeedbackType") or "abuse"
        return [
            Event(
                at=_time(complaint.get("timestamp")),
                status=DeliveryStatus.complained,
                detail=f"complaint: {feedback}",
                recipient=text_or_none(obj(entry).get("emailAddress")),
                suppress=f"complaint (ses: {feedback})",
                **base,
            )
            for entry in complaint.get("complainedRecipients") or [{}]
        ]
    return []


def _notification_id(mail: dict[str, Any]) -> int | None:
    headers = mail.get("headers")
    for header in headers if isinstance(headers, list) else []:
        if str(obj(header).get("name")).lower() == "x-notifier-id":
            return row_id(obj(header).get("value"))
    common = obj(mail.get("commonHeaders"))
    found = _MESSAGE_ID.search(str(common.get("messageId") or ""))
    return int(found[1]) if found else None


def _time(value: object) -> datetime:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise Refused(400, f"SES timestamp {str(value)[:40]!r} is not ISO 8601") from None


def _certificate_key(url: str) -> rsa.RSAPublicKey:
    """The RSA key of the certificate at ``url``, fetched once per process."""
    with _certs_lock:
        key = _certs.get(url)
    if key is not None:
        return key
    try:
        response = httpx.get(url, timeout=10, follow_redirects=False)
        response.raise_for_status()
        if len(response.content) > _MAX_CERT_BYTES:
            raise Refused(403, "SNS signing certificate is too large")
        public = x509.load_pem_x509_certificate(response.content).public_key()
    except (httpx.HTTPError, ValueError) as exc:
        raise Refused(403, f"SNS signing certificate unusable: {exc}") from None
    if not isinstance(public, rsa.RSAPublicKey):
        raise Refused(403, "SNS signing certificate has no RSA key")
    with _certs_lock:
        _certs[url] = public
    return public
