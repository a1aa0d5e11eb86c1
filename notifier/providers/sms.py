"""The ``sms`` channel: one text message per row through Twilio's Messages API.

A send is ``POST {NOTIFIER_TWILIO_API_BASE}/2010-04-01/Accounts/{sid}/Messages.json``, form-encoded
``To``, ``From`` (or ``MessagingServiceSid``) and ``Body``, with HTTP basic auth (account SID,
auth token). Twilio answers ``201`` with the Message resource (``sid``, ``status``) or an error
document ``{"code", "message", "more_info", "status"}``.

Only what the producer can fix is ``Permanent``: a number Twilio calls invalid, unreachable or
unsubscribed (any other 4xx error code too). What the operator must fix (missing settings,
rejected credentials, a wrong API base, a sender Twilio refuses) is a ``Retry`` naming the
setting, so the rows wait for the fix instead of dying; so are throttling, 5xx and the network.

The API base is operator configuration, not producer input, so no SSRF guard applies; it must
still be https (the auth token travels in every request) unless it is loopback, where tests
and local fakes listen.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar
from urllib.parse import quote, urlsplit

import httpx

from notifier.models import Notification, truncate
from notifier.providers.base import InvalidNotification, Outcome, Permanent, Provider, Retry, Sent
from notifier.providers.http import SharedClient, parse_retry_after
from notifier.providers.netguard import is_loopback
from notifier.settings import Settings

MAX_BODY_CHARS = 1600  # Twilio's limit for Body (error 21617 beyond it)
#: Twilio's answers are a few KiB (the Message resource echoes the body); more is not Twilio.
MAX_RESPONSE_BYTES = 65_536
_E164 = re.compile(r"\+[1-9][0-9]{6,14}")  # [0-9], not \d: \d also matches other scripts' digits
_MESSAGING_SERVICE = re.compile(r"MG[0-9a-fA-F]{32}")
#: Error codes of a 400 that blame the configured sender, not the row: 21606 "'From' is not a
#: valid message-capable Twilio number", 21659 "'From' is not a Twilio phone number".
_SENDER_CODES = frozenset({21606, 21659})
_CREDENTIALS = "check NOTIFIER_TWILIO_ACCOUNT_SID and NOTIFIER_TWILIO_AUTH_TOKEN"
_ENDPOINT = "check NOTIFIER_TWILIO_API_BASE and NOTIFIER_TWILIO_ACCOUNT_SID"


class SmsProvider(Provider):
    """Sends through one ``httpx.Client`` shared by every send thread, created on first use.

    Missing or unusable settings do not stop the worker from starting (deployments without SMS
    load this provider too): every send then answers a ``Retry`` that names the setting.
    ``close`` keeps the client so batches reuse connections; ``shutdown`` closes it.
    """

    channel: ClassVar[str] = "sms"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        s = self._settings = settings
        self._timeout = s.sms_timeout
        base = s.twilio_api_base.rstrip("/")
        sid = s.twilio_account_sid or ""
        self._base = base
        self._url = f"{base}/2010-04-01/Accounts/{quote(sid, safe='')}/Messages.json"
        self._where = urlsplit(base).netloc or base
        sender = s.twilio_from or ""
        is_service = _MESSAGING_SERVICE.fullmatch(sender) is not None
        self._sender = ("MessagingServiceSid" if is_service else "From", sender)
        self._misconfigured = _configuration_error(s)
        self._client = SharedClient(self._new_client)

    def problem(self) -> str | None:
        return self._misconfigured

    def validate(self, notification: Notification) -> None:
        """The recipient must be an E.164 number and the body 1-1600 characters of text.

        ``subject`` is ignored: an SMS has none. Newlines in the body are fine. Settings are not
        checked here: a deployment's mistake must not make the producer's rows ``dead``.
        """
        self.validate_recipient(notification.recipient)
        body = notification.body
        if body is None or not body.strip():
            raise InvalidNotification("body is empty; put the text of the SMS there")
        if len(body) > MAX_BODY_CHARS:
            raise InvalidNotification(
                f"body is {len(body)} characters; Twilio sends at most {MAX_BODY_CHARS}"
            )

    def validate_recipient(self, recipient: str) -> None:
        if not _E164.fullmatch(recipient):
            raise InvalidNotification(
                f"recipient {recipient[:100]!r} is not an E.164 phone number like +14155550100 "
                "('+', country code, number; digits only, no spaces or dashes)"
            )

    def send(self, notification: Notification) -> Outcome:
        if self._misconfigured is not None:
            return Retry(self._misconfigured)
        form = {"To": notification.recipient, "Body": notification.body or ""}
        form[self._sender[0]] = self._sender[1]
        try:
            with self._client.get().stream("POST", self._url, data=form) as response:
                return self._outcome(response)
        except httpx.TimeoutException as exc:
            return Retry(
                f"timed out ({type(exc).__name__}) after the {self._timeout:g}s limit "
                f"(NOTIFIER_SMS_TIMEOUT) POSTing to Twilio at {self._where}"
            )
        except httpx.TransportError as exc:
            return Retry(
                truncate(f"{type(exc).__name__} POSTing to Twilio at {self._where}: {exc}")
            )

    def close(self) -> None:
        """Called after every batch; keeps the client so the next batch reuses its connections."""

    def shutdown(self) -> None:
        """Close the client and its connections; a later send opens a new one."""
        self._client.close()

    def _new_client(self) -> httpx.Client:
        s = self._settings
        return httpx.Client(
            auth=httpx.BasicAuth(s.twilio_account_sid or "", s.twilio_auth_token or ""),
            timeout=httpx.Timeout(self._timeout),
            follow_redirects=False,
            headers={"Accept": "application/json", "Accept-Encoding": "identity"},
        )

    def _outcome(self, response: httpx.Response) -> Outcome:
        status = response.status_code
        raw = _read_capped(response)
        doc = _json_object(raw)
        if 200 <= status < 300:
            return _accepted(doc)
        error = _describe(status, doc, raw)
        if status in (408, 429) or status >= 500:
            retry_after = parse_retry_after(response.headers.get("retry-after"))
            return Retry(error, retry_after, throttled=status == 429)
        if status in (401, 403):
            return Retry(truncate(f"{error}; {_CREDENTIALS}"))
        if 300 <= status < 400 or status in (404, 405):  # the URL is wrong, not the row
            return Retry(truncate(f"{error}; {_ENDPOINT} (the URL was {self._base})"))
        if doc is not None and doc.get("code") in _SENDER_CODES:
            return Retry(truncate(f"{error}; check NOTIFIER_TWILIO_FROM"))
        return Permanent(error)


def _configuration_error(s: Settings) -> str | None:
    """Why this deployment cannot send SMS at all, naming the settings; ``None`` if it can."""
    missing = [
        f"NOTIFIER_TWILIO_{name.upper()}"
        for name, value in (
            ("account_sid", s.twilio_account_sid),
            ("auth_token", s.twilio_auth_token),
            ("from", s.twilio_from),
        )
        if not value
    ]
    if missing:
        return f"SMS is not configured: set {', '.join(missing)}"
    parts = urlsplit(s.twilio_api_base)
    host = parts.hostname or ""
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number in range
        httpx.URL(s.twilio_api_base)
    except (ValueError, httpx.InvalidURL):
        host = ""
    if not host or parts.scheme not in ("http", "https"):
        return f"NOTIFIER_TWILIO_API_BASE {s.twilio_api_base!r} is not an https:// URL"
    if parts.scheme == "http" and not is_loopback(host):
        return (
            f"NOTIFIER_TWILIO_API_BASE {s.twilio_api_base!r} uses plain http; use https "
            "(the auth token is in every request; http is only accepted on loopback)"
        )
    return None


def _accepted(doc: dict[str, Any] | None) -> Outcome:
    """A 2xx: Twilio created the message, unless the resource already says it failed.

    An unreadable 2xx body is still ``Sent``: the message exists, and a retry would send a
    second one.
    """
    if doc is None:
        return Sent(None)
    sid = doc.get("sid") if isinstance(doc.get("sid"), str) else None
    status = doc.get("status")
    if status in ("failed", "undelivered"):
        code, message = doc.get("error_code"), doc.get("error_message")
        what = f"Twilio {code}: {message or 'message ' + status}" if code else f"message {status}"
        return Permanent(truncate(f"{what} (status {status}, message {sid})"))
    return Sent(sid)


def _describe(status: int, doc: dict[str, Any] | None, raw: str) -> str:
    """``Twilio 21211: The 'To' number ... (HTTP 400, see <more_info>)``, or the raw text.

    At most 400 characters, leaving room for the hint that names a setting.
    """
    if doc is not None and doc.get("code") is not None:
        more = f", see {doc['more_info']}" if isinstance(doc.get("more_info"), str) else ""
        text = f"Twilio {doc['code']}: {doc.get('message')} (HTTP {status}{more})"
    elif doc is not None and isinstance(doc.get("message"), str):
        text = f"HTTP {status} from Twilio: {doc['message']}"
    else:
        text = f"HTTP {status} from Twilio: {truncate(raw, 300) or '(empty body)'}"
    return truncate(text, 400)


def _json_object(raw: str) -> dict[str, Any] | None:
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _read_capped(response: httpx.Response) -> str:
    """At most ``MAX_RESPONSE_BYTES`` of the body, so a runaway answer cannot fill memory."""
    chunks = bytearray()
    for chunk in response.iter_bytes():
        chunks += chunk
        if len(chunks) >= MAX_RESPONSE_BYTES:
            break
    return bytes(chunks[:MAX_RESPONSE_BYTES]).decode("utf-8", errors="replace")
