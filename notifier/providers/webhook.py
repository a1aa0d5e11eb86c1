"""The ``webhook`` channel: POST the notification as JSON to the URL in ``recipient``.

Requests follow Standard Webhooks (standardwebhooks.com): ``webhook-id`` is stable across
retries so receivers can drop duplicates, and with ``NOTIFIER_WEBHOOK_SECRET`` set every request
carries ``webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``.

Targets on internal networks are refused (``netguard``): an IP literal already by ``validate``,
a host name when its connection is opened, against the very addresses it then connects to.
Redirects are never followed, so they cannot lead anywhere unchecked.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import threading
import time
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from importlib.metadata import PackageNotFoundError, version
from typing import ClassVar
from urllib.parse import urlsplit

import httpx

from notifier.models import Notification
from notifier.providers.base import InvalidNotification, Outcome, Permanent, Retry, Sent, truncate
from notifier.providers.netguard import AddressPolicy, BlockedAddress, guarded_transport
from notifier.settings import Settings, get_settings

MAX_URL_LENGTH = 2048
ERROR_BODY_BYTES = 1024


def _limits(settings: Settings) -> httpx.Limits:
    """Keep as many idle connections as sends run at once, so a busy worker reuses them
    instead of closing and reopening one per send (httpx keeps only 20 by default)."""
    concurrency = settings.send_concurrency
    return httpx.Limits(
        max_connections=max(100, 2 * concurrency),
        max_keepalive_connections=max(20, concurrency),
        keepalive_expiry=5.0,
    )


def _user_agent() -> str:
    try:
        return f"notifier/{version('notifier')}"
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "notifier/unknown"


def _signing_key(secret: str) -> bytes:
    """Standard Webhooks secrets are ``whsec_`` + base64; any other string is used as is."""
    if not secret.startswith("whsec_"):
        return secret.encode()
    try:
        return base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except binascii.Error:
        # Say nothing about the value: this text ends up in logs.
        raise ValueError(
            "NOTIFIER_WEBHOOK_SECRET starts with whsec_ but the rest is not valid base64"
        ) from None


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds a ``Retry-After`` asks for (delta-seconds or an HTTP-date); ``None`` if unusable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        at = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if at.tzinfo is None:  # "-0000" dates parse naive; HTTP-dates are always GMT
        at = at.replace(tzinfo=UTC)
    return max(0.0, (at - (now or datetime.now(UTC))).total_seconds())


class WebhookProvider:
    """Sends through one ``httpx.Client`` shared by every send thread, created on first use.

    The client is kept across batches so connections to busy receivers are reused; httpx drops
    those idle past its keep-alive expiry (5 s) the next time the pool is used. ``close`` is
    therefore a no-op, and ``shutdown`` really closes the client (tests, process exit).
    """

    channel: ClassVar[str] = "webhook"

    def __init__(self, settings: Settings | None = None) -> None:
        self._settings = settings or get_settings()
        secret = self._settings.webhook_secret
        self._key = _signing_key(secret) if secret else None
        self._timeout = self._settings.webhook_timeout
        self._policy = AddressPolicy(self._settings.webhook_allowed_networks)
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    def validate(self, notification: Notification) -> None:
        url = notification.recipient
        if not url.strip():
            raise InvalidNotification("recipient is empty; put the https:// URL to POST to there")
        if len(url) > MAX_URL_LENGTH:
            raise InvalidNotification(
                f"recipient URL is {len(url)} characters long; at most {MAX_URL_LENGTH} allowed"
            )
        if any(c.isspace() or not c.isprintable() for c in url):
            raise InvalidNotification(
                "recipient URL contains whitespace or control characters (CR/LF, tab, space); "
                "percent-encode them"
            )
        parts = urlsplit(url)
        if not parts.scheme or not parts.hostname:
            raise InvalidNotification(
                "recipient is not an absolute URL; expected https://host/path"
            )
        if parts.scheme == "http" and not self._settings.webhook_allow_http:
            raise InvalidNotification(
                "recipient URL uses plain http; use https (http:// is only accepted when "
                "NOTIFIER_WEBHOOK_ALLOW_HTTP=true, for local development)"
            )
        if parts.scheme not in ("http", "https"):
            raise InvalidNotification(
                f"recipient URL scheme {parts.scheme!r} is not supported; use https"
            )
        try:
            parts.port  # noqa: B018 - raises on a port that is not a number in range
            httpx.URL(url)
        except (ValueError, httpx.InvalidURL) as exc:
            raise InvalidNotification(f"recipient URL is malformed: {exc}") from None
        refusal = self._policy.check_literal(parts.hostname)
        if refusal is not None:
            raise InvalidNotification(refusal)
        try:
            self._body(notification)
        except (TypeError, ValueError) as exc:
            raise InvalidNotification(f"payload is not JSON-serializable: {exc}") from None

    def send(self, notification: Notification) -> Outcome:
        body = self._body(notification)
        msg_id = f"notification-{notification.id}"
        timestamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            "Accept-Encoding": "identity",  # the error text is read raw, never decompressed
            "webhook-id": msg_id,
            "webhook-timestamp": timestamp,
        }
        if self._key is not None:
            signed = f"{msg_id}.{timestamp}.".encode() + body
            digest = hmac.new(self._key, signed, hashlib.sha256).digest()
            headers["webhook-signature"] = "v1," + base64.b64encode(digest).decode()
        url = httpx.URL(notification.recipient)
        host = url.host + (f":{url.port}" if url.port else "")
        try:
            with self._get_client().stream("POST", url, content=body, headers=headers) as response:
                status = response.status_code
                if 200 <= status < 300:
                    _read_some(response)  # an exhausted small body lets the connection be reused
                    return Sent(msg_id)
                if 300 <= status < 400:
                    location = response.headers.get("location", "nowhere")
                    return Permanent(
                        f"HTTP {status} redirect to {truncate(location, 200)}; redirects are "
                        "not followed, update the URL"
                    )
                error = f"HTTP {status} from {host}: {truncate(_read_some(response), 300)}"
                if status in (408, 429) or status >= 500:
                    retry_after = parse_retry_after(response.headers.get("retry-after"))
                    return Retry(error, retry_after, throttled=status == 429)
                return Permanent(error)
        except BlockedAddress as exc:  # raised by the connection, before anything was sent
            return Permanent(str(exc))
        except httpx.TimeoutException as exc:
            return Retry(
                f"timed out ({type(exc).__name__}) after the {self._timeout:g}s limit "
                f"POSTing to {host}"
            )
        except httpx.TransportError as exc:
            return Retry(truncate(f"{type(exc).__name__} POSTing to {host}: {exc}"))

    def close(self) -> None:
        """Called after every batch; keeps the client so the next batch reuses its connections."""

    def shutdown(self) -> None:
        """Close the client and its connections; a later send opens a new one."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def _get_client(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                self._client = httpx.Client(
                    transport=guarded_transport(self._policy, _limits(self._settings)),
                    timeout=httpx.Timeout(self._timeout),
                    follow_redirects=False,
                    headers={"User-Agent": _user_agent()},
                )
            return self._client

    @staticmethod
    def _body(n: Notification) -> bytes:
        document = {"id": n.id, "subject": n.subject, "body": n.body, "payload": n.payload}
        return json.dumps(document, separators=(",", ":")).encode()


def _read_some(response: httpx.Response) -> str:
    """At most ``ERROR_BODY_BYTES`` of the body: enough to explain an error, bounded in size."""
    chunks = bytearray()
    for chunk in response.iter_raw():
        chunks += chunk
        if len(chunks) >= ERROR_BODY_BYTES:
            break
    return bytes(chunks[:ERROR_BODY_BYTES]).decode("utf-8", errors="replace")
