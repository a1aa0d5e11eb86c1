"""Twilio's status callbacks and incoming messages, verified as Twilio documents ("Webhooks
security"): ``X-Twilio-Signature`` is base64 HMAC-SHA1, under the account's auth token
(``NOTIFIER_TWILIO_AUTH_TOKEN``), of the full URL Twilio requested followed by every POST
parameter's name and value, sorted by name (case-sensitive), without separators. The URL is
``NOTIFIER_EVENTS_PUBLIC_URL`` plus the request's path and query: what Twilio saw, whatever
proxy stands between.

A status callback (``MessageSid``, ``MessageStatus``, ``ErrorCode``, ``To``) carries no time:
the report is taken as happening when it arrives. ``delivered`` (and ``read``) is delivered,
``undelivered`` and ``failed`` are undelivered; error 21610 (the recipient replied STOP
earlier) suppresses the number. An incoming message (``Body``, ``From``) whose body is one of
Twilio's opt-out keywords (STOP, STOPALL, UNSUBSCRIBE, CANCEL, END, QUIT, OPTOUT, REVOKE)
suppresses its sender.

Order of checks, cheapest first: the token and public URL are configured (403); the
signature header is present (401) and base64 of a SHA-1 digest (403), both before the body is
read (``check_header``); the body is a form of at most ``MAX_FIELDS`` fields (400); then the
signature (403).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from urllib.parse import parse_qsl

from notifier.events.model import DeliveryStatus, Event, Refused
from notifier.settings import Settings

SIGNATURE = "x-twilio-signature"
OPT_OUT = frozenset({"STOP", "STOPALL", "UNSUBSCRIBE", "CANCEL", "END", "QUIT", "OPTOUT", "REVOKE"})
#: Fields a form may have: Twilio sends a few dozen at most.
MAX_FIELDS = 200
_SIGNATURE = re.compile(r"[A-Za-z0-9+/]{27}=")  # base64 of the 20 bytes of SHA-1
_STATUS = {
    "delivered": DeliveryStatus.delivered,
    "read": DeliveryStatus.delivered,
    "undelivered": DeliveryStatus.undelivered,
    "failed": DeliveryStatus.undelivered,
}


def signature(auth_token: str, url: str, params: Sequence[tuple[str, str]]) -> str:
    """What Twilio sends as ``X-Twilio-Signature`` for a POST of ``params`` to ``url``."""
    data = url + "".join(name + value for name, value in sorted(params))
    digest = hmac.new(auth_token.encode(), data.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def check_header(given: str | None, s: Settings) -> str:
    """The signature header, or ``Refused`` for all that it alone shows."""
    if not s.twilio_auth_token or not s.events_public_url:
        raise Refused(403, "NOTIFIER_TWILIO_AUTH_TOKEN or NOTIFIER_EVENTS_PUBLIC_URL is not set")
    if not given:
        raise Refused(401, "X-Twilio-Signature missing")
    if not _SIGNATURE.fullmatch(given):
        raise Refused(403, "X-Twilio-Signature is not base64 of an HMAC-SHA1")
    return given


def parse(body: bytes) -> list[tuple[str, str]]:
    """The form's fields, in order; ``Refused(400)`` past ``MAX_FIELDS``."""
    try:
        return parse_qsl(
            body.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=MAX_FIELDS
        )
    except ValueError:
        raise Refused(400, f"Twilio form has more than {MAX_FIELDS} fields") from None


def verify(
    path: str, query: str, params: Sequence[tuple[str, str]], given: str | None, s: Settings
) -> None:
    given = check_header(given, s)
    url = (s.events_public_url or "").rstrip("/") + path + (f"?{query}" if query else "")
    expected = signature(s.twilio_auth_token or "", url, params)
    if not hmac.compare_digest(expected.encode(), given.encode()):
        raise Refused(403, "Twilio signature does not verify")


def events(params: Sequence[tuple[str, str]]) -> list[Event]:
    form = dict(params)
    now = datetime.now(UTC)
    if "MessageStatus" in form:
        status = _STATUS.get(form["MessageStatus"])
        if status is None:
            return []
        code = form.get("ErrorCode") or ""
        opted_out = code == "21610"
        detail = form["MessageStatus"] + (f" (error {code})" if code else "")
        return [
            Event(
                provider="twilio",
                channel="sms",
                at=now,
                status=status,
                detail=detail,
                recipient=form.get("To"),
                provider_message_id=form.get("MessageSid"),
                suppress="sms opt-out (twilio error 21610)" if opted_out else None,
            )
        ]
    keyword = form.get("Body", "").strip().upper()
    if keyword in OPT_OUT and form.get("From"):
        return [
            Event(
                provider="twilio",
                channel="sms",
                at=now,
                recipient=form["From"],
                suppress=f"sms opt-out (replied {keyword})",
            )
        ]
    return []
