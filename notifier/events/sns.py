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

Order of checks, cheapest first; nothing is fetched before the last but one:

1. the body is a JSON object of bounded depth (400);
2. ``Type`` is one of the three, and every signed key it needs, the signature and the
   certificate URL are strings; ``Timestamp`` is an ISO 8601 time (400). Its age is not
   limited: SNS retries a delivery for as long as the subscription's policy says, and a
   replayed report changes nothing a first one did not;
3. ``TopicArn`` is allowed (403);
4. ``SignatureVersion`` is 1 or 2, ``Signature`` is base64 of a sane length (403);
5. ``SigningCertURL`` is plain (no user, query, fragment, percent-encoding, dot segment,
   whitespace or backslash; a ``.pem`` path) and the pattern covers its whole host (403);
6. the certificate: cached per URL (``Certificates``), one fetch in flight per URL;
7. the signature (403).

The ``Message`` of a notification is SES's JSON (``notificationType``, or ``eventType`` for
event publishing): ``Delivery``, ``Bounce`` (``bounceType`` ``Permanent`` is hard,
``Transient`` and ``Undetermined`` soft) or ``Complaint``, with ``mail.headers`` (when the
identity includes original headers: ``X-Notifier-Id``), ``mail.tags`` (event publishing through
a configuration set: the tag ``notifier_id``), ``mail.commonHeaders.messageId`` and
``mail.messageId``, SES's id, which the ``ses`` provider stored as ``provider_message_id``.
"""

from __future__ import annotations

import base64
import binascii
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime
from typing import Any

import httpx
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from notifier.events.model import (
    DeliveryStatus,
    Event,
    Refused,
    iso_time,
    listed,
    obj,
    parse_json,
    row_id,
    text_or_none,
)
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
TYPES = ("Notification", "SubscriptionConfirmation", "UnsubscribeConfirmation")
#: Certificates kept, least recently used dropped first: AWS signs with one per region.
CERT_CACHE_SIZE = 32
#: Seconds a failed certificate fetch is remembered (and answered) before it is tried again.
CERT_RETRY_SECONDS = 10.0
#: Seconds a certificate fetch may take in all, connecting and reading.
CERT_TIMEOUT = 10.0
_HASHES: dict[str, type[hashes.HashAlgorithm]] = {"1": hashes.SHA1, "2": hashes.SHA256}
_MESSAGE_ID = re.compile(r"<notification-(\d{1,18})@")
_MAX_CERT_BYTES = 65_536
_MAX_SIGNATURE_CHARS = 1_400  # base64 of a 8192-bit RSA signature
_SEGMENT = r"/[A-Za-z0-9_-][A-Za-z0-9_.-]{0,199}"
#: A URL with nothing in it a parser could read two ways: scheme, lower-case host, port, path of
#: plain segments (none ``.`` or ``..``, none empty), and for a SubscribeURL a plain query.
_PLAIN_URL = re.compile(
    rf"(?P<origin>https?://[a-z0-9-]{{1,63}}(?:\.[a-z0-9-]{{1,63}}){{0,8}}(?::[0-9]{{1,5}})?)"
    rf"(?P<path>(?:{_SEGMENT}){{0,8}}/?)(?P<query>\?[A-Za-z0-9_.:%=&+-]{{0,1500}})?"
)


def string_to_sign(doc: dict[str, Any]) -> bytes:
    """The canonical string SNS signs for this message's type."""
    keys = NOTIFICATION_KEYS if doc.get("Type") == "Notification" else CONFIRMATION_KEYS
    return "".join(f"{k}\n{doc[k]}\n" for k in keys if isinstance(doc.get(k), str)).encode()


def verify(doc: dict[str, Any], settings: Settings) -> None:
    """Raise ``Refused`` unless ``doc`` is signed by SNS for one of the allowed topics."""
    kind = doc.get("Type")
    if kind not in TYPES:
        raise Refused(400, f"SNS Type is not one of {', '.join(TYPES)}")
    keys = NOTIFICATION_KEYS if kind == "Notification" else CONFIRMATION_KEYS
    needed = [k for k in keys if k != "Subject"] + ["SignatureVersion", "Signature"]
    for key in [*needed, "SigningCertURL"]:
        if not isinstance(doc.get(key), str):
            raise Refused(400, f"SNS {key} is missing or not a string")
    if "Subject" in doc and not isinstance(doc["Subject"], str):
        raise Refused(400, "SNS Subject is not a string")
    iso_time(doc["Timestamp"], "SNS Timestamp")
    allowed = {arn.strip() for arn in settings.sns_topic_arns.split(",") if arn.strip()}
    if doc["TopicArn"] not in allowed:
        raise Refused(403, "SNS topic not in NOTIFIER_SNS_TOPIC_ARNS")
    algorithm = _HASHES.get(doc["SignatureVersion"])
    if algorithm is None:
        raise Refused(403, "SNS SignatureVersion is neither 1 nor 2")
    try:
        if len(doc["Signature"]) > _MAX_SIGNATURE_CHARS:
            raise ValueError("too long")
        signature = base64.b64decode(doc["Signature"], validate=True)
    except (binascii.Error, ValueError):
        raise Refused(403, "SNS Signature is not base64 of an RSA signature") from None
    url = allowed_url(doc["SigningCertURL"], settings.sns_cert_url_pattern)
    if url is None or not url.endswith(".pem"):
        raise Refused(403, "SNS SigningCertURL is not a certificate on an allowed SNS host")
    public = certificates.key(url)
    try:
        public.verify(signature, string_to_sign(doc), padding.PKCS1v15(), algorithm())
    except InvalidSignature:
        raise Refused(403, "SNS signature does not verify") from None


def allowed_url(url: object, pattern: str, *, query: bool = False) -> str | None:
    """``url`` if it is plain (``_PLAIN_URL``; a query only with ``query``) and ``pattern``
    matches it from its start through at least its whole host and port, else ``None``: the
    pattern cannot be met by a host that merely begins like an allowed one."""
    found = _PLAIN_URL.fullmatch(url) if isinstance(url, str) and len(url) <= 2048 else None
    if found is None or (found["query"] and not query) or not found["path"].startswith("/"):
        return None
    matched = re.match(pattern, found[0])
    return found[0] if matched and matched.end() >= len(found["origin"]) else None


def confirm(doc: dict[str, Any], settings: Settings) -> None:
    """Confirm a verified subscription by fetching its SubscribeURL (an allowed host only)."""
    url = allowed_url(doc.get("SubscribeURL"), settings.sns_cert_url_pattern, query=True)
    if url is None:
        raise Refused(403, "SNS SubscribeURL is not an allowed SNS host")
    try:
        httpx.get(url, timeout=10, follow_redirects=False).raise_for_status()
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise Refused(502, f"SNS subscription not confirmed: {exc}") from None


def events(doc: dict[str, Any]) -> list[Event]:
    """The SES reports in a verified SNS notification."""
    message = parse_json(str(doc.get("Message")), "SNS Message", dict)
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
            for recipient in listed(delivery.get("recipients")) or [None]
        ]
    if kind == "Bounce":
        bounce = obj(message.get("bounce"))
        hard = bounce.get("bounceType") == "Permanent"
        what = f"{bounce.get('bounceType')}/{bounce.get('bounceSubType')}"
        found = []
        for entry in listed(bounce.get("bouncedRecipients")) or [{}]:
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
            for entry in listed(complaint.get("complainedRecipients")) or [{}]
        ]
    return []


def _notification_id(mail: dict[str, Any]) -> int | None:
    """The row a report names: by ``X-Notifier-Id`` among the original headers, by the message
    tag ``notifier_id`` (event publishing; the ``ses`` provider sets it), or by the
    ``Message-ID`` notifier wrote (a relay that keeps it; SES itself replaces it)."""
    for header in listed(mail.get("headers")):
        if str(obj(header).get("name")).lower() == "x-notifier-id":
            return row_id(obj(header).get("value"))
    tagged = listed(obj(mail.get("tags")).get("notifier_id"))
    if tagged:
        return row_id(tagged[0])
    common = obj(mail.get("commonHeaders"))
    found = _MESSAGE_ID.search(str(common.get("messageId") or ""))
    return int(found[1]) if found else None


def _time(value: object) -> datetime:
    return iso_time(value, "SES timestamp")


class Certificates:
    """Signing keys by certificate URL, fetched by ``fetch``: at most ``size`` kept (the least
    recently used dropped first), a failed fetch answered from memory for ``retry_after``
    seconds, and one fetch in flight per URL: concurrent requests for it wait for that one."""

    def __init__(
        self,
        fetch: Callable[[str], rsa.RSAPublicKey],
        size: int = CERT_CACHE_SIZE,
        retry_after: float = CERT_RETRY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch, self._size, self._retry_after, self._clock = fetch, size, retry_after, clock
        self._keys: OrderedDict[str, rsa.RSAPublicKey] = OrderedDict()
        self._failed: OrderedDict[str, tuple[float, str]] = OrderedDict()
        self._flights: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    def key(self, url: str) -> rsa.RSAPublicKey:
        with self._lock:
            known = self._known(url)
            flight = self._flights.setdefault(url, threading.Lock()) if known is None else None
        if flight is None:
            return self._answer(known)
        with flight:  # the first caller fetches; the others wait here, then find its result
            with self._lock:
                known = self._known(url)
            if known is None:
                try:
                    known = self._fetch(url)
                except Refused as exc:
                    known = exc
                finally:
                    with self._lock:
                        self._remember(url, known)
                        self._flights.pop(url, None)
            return self._answer(known)

    def _known(self, url: str) -> rsa.RSAPublicKey | Refused | None:
        key = self._keys.get(url)
        if key is not None:
            self._keys.move_to_end(url)
            return key
        until, reason = self._failed.get(url, (0.0, ""))
        if until > self._clock():
            return Refused(403, reason)
        self._failed.pop(url, None)
        return None

    def _remember(self, url: str, found: rsa.RSAPublicKey | Refused | None) -> None:
        if isinstance(found, rsa.RSAPublicKey):
            self._keys[url] = found
            while len(self._keys) > self._size:
                self._keys.popitem(last=False)
        elif isinstance(found, Refused):
            self._failed[url] = (self._clock() + self._retry_after, found.reason)
            while len(self._failed) > self._size:
                self._failed.popitem(last=False)

    @staticmethod
    def _answer(known: rsa.RSAPublicKey | Refused | None) -> rsa.RSAPublicKey:
        if isinstance(known, Refused):
            raise known
        assert known is not None
        return known


def fetch_key(url: str) -> rsa.RSAPublicKey:
    """The RSA key of the certificate at ``url``: at most ``_MAX_CERT_BYTES``, within
    ``CERT_TIMEOUT`` seconds, no redirect followed."""
    deadline = time.monotonic() + CERT_TIMEOUT
    try:
        with httpx.stream("GET", url, timeout=CERT_TIMEOUT, follow_redirects=False) as response:
            response.raise_for_status()
            content = b""
            for chunk in response.iter_bytes():
                content += chunk
                if len(content) > _MAX_CERT_BYTES:
                    raise Refused(403, "SNS signing certificate is too large")
                if time.monotonic() > deadline:
                    raise Refused(403, "SNS signing certificate took too long to fetch")
        public = x509.load_pem_x509_certificate(content).public_key()
    except (httpx.HTTPError, httpx.InvalidURL, ValueError) as exc:
        raise Refused(403, f"SNS signing certificate unusable: {exc}") from None
    if not isinstance(public, rsa.RSAPublicKey):
        raise Refused(403, "SNS signing certificate has no RSA key")
    return public


#: The process's certificates: every request of the endpoint shares them.
certificates = Certificates(fetch_key)
