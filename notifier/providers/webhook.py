"""The ``webhook`` channel: POST the notification as JSON to the URL in ``recipient``.

Requests follow Standard Webhooks (``notifier.signing``): ``webhook-id`` is stable across
retries so receivers can drop duplicates, and with ``NOTIFIER_WEBHOOK_SECRET`` set every request
carries ``webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``. The POST
itself, and what its answer means, is ``notifier.providers.http.post``.

Sends are coroutines (``send_async``, on aiohttp): the dispatcher runs many at once on the worker
process's event loop, where a send waiting for its receiver costs almost nothing. The blocking
``send`` (rows with a guard, which go through threads) waits on that same loop for
``send_async``, so there is one client, one pool of keep-alive connections and one behaviour.

Targets on internal networks are refused (``netguard``): an IP literal already by ``validate``,
a host name when its connection is opened, against the very addresses it then connects to.
Redirects are never followed, so they cannot lead anywhere unchecked.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from importlib.metadata import PackageNotFoundError, version
from typing import ClassVar
from urllib.parse import urlsplit

import aiohttp
import httpx
import yarl

from notifier import eventloop
from notifier.models import Notification, truncate
from notifier.providers import hostname
from notifier.providers.base import InvalidNotification, Outcome, Permanent, Provider
from notifier.providers.http import post, receiver_scope
from notifier.providers.netguard import AddressPolicy, GuardedResolver, guarded_socket, legacy_ipv4
from notifier.settings import Settings
from notifier.signing import signing_key

MAX_URL_LENGTH = 2048
#: Seconds an idle keep-alive connection is kept: shorter than most receivers' own idle
#: timeout, so a receiver seldom closes a connection just as a send reuses it.
KEEPALIVE_SECONDS = 5.0


def _pool_size(settings: Settings) -> int:
    """A connection for every send that can run at once in the process, on the loop and in
    threads, all kept alive: with fewer, a busy worker closes and reopens one per send (the
    churn that also widens the window for duplicates)."""
    return settings.async_send_concurrency + settings.send_concurrency


def _user_agent() -> str:
    try:
        return f"notifier/{version('notifier')}"
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "notifier/unknown"


class WebhookProvider(Provider):
    """Sends through one ``aiohttp.ClientSession``, made on first use on the loop that sends.

    The session is kept across batches so connections to busy receivers are reused; aiohttp
    drops those idle for ``KEEPALIVE_SECONDS``. ``close`` (after every batch) is therefore a
    no-op, and ``shutdown`` really closes the session (worker shutdown, tests).
    """

    channel: ClassVar[str] = "webhook"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self._settings = settings
        secret = self._settings.webhook_secret
        self._key = signing_key(secret) if secret else None
        self._timeout = self._settings.webhook_timeout
        # Connecting (waiting for a pooled connection included), each read, and the whole send:
        # aiohttp has no write timeout, so the total also ends a receiver that stops reading.
        self._timeouts = aiohttp.ClientTimeout(
            total=3 * self._timeout,
            connect=self._timeout,
            sock_connect=self._timeout,
            sock_read=self._timeout,
        )
        self._policy = AddressPolicy(self._settings.webhook_allowed_networks)
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None

    def validate(self, notification: Notification) -> None:
        self.validate_recipient(notification.recipient)
        try:
            self._body(notification)
        except (TypeError, ValueError) as exc:
            raise InvalidNotification(f"payload is not JSON-serializable: {exc}") from None

    def validate_recipient(self, url: str) -> None:
        """The URL alone, without any lookup: its host's addresses are checked when sending."""
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
        try:
            parts = urlsplit(url)
        except ValueError as exc:  # e.g. an unclosed IPv6 bracket: https://[::1/
            raise InvalidNotification(f"recipient URL is malformed: {exc}") from None
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
            port = parts.port  # raises on a port that is not a number in range
            raw_host = yarl.URL(url).raw_host or ""
        except ValueError as exc:
            raise InvalidNotification(f"recipient URL is malformed: {exc}") from None
        if port == 0:
            raise InvalidNotification(
                "recipient URL has port 0, which no connection can reach; give the receiver's "
                "port (1-65535), or none for the scheme's default"
            )
        self._check_host(parts.hostname)
        if not _is_ip_literal(parts.hostname):
            name_problem = hostname.problem(raw_host, underscore=True)
            if name_problem is not None:
                raise InvalidNotification(
                    f"recipient URL host {truncate(raw_host, 100)!r} can never be looked up: it "
                    + name_problem
                )

    def throttle_scope(self, notification: Notification) -> str | None:
        """The receiver a row goes to: a 429 holds back that receiver (``receiver_scope``)."""
        return receiver_scope(notification.recipient)

    def send(self, notification: Notification) -> Outcome:
        """``send_async``, waited for on the process's event loop: for a caller in a thread."""
        return eventloop.run(self.send_async(notification))

    async def send_async(self, notification: Notification) -> Outcome:
        """POST the row; every failure becomes an outcome, within ``3 * webhook_timeout``."""
        try:
            url = yarl.URL(notification.recipient)
        except ValueError as exc:
            return Permanent(truncate(f"recipient URL is malformed: {exc}"))
        msg_id = f"notification-{notification.id}"
        return await post(self._client(), url, msg_id, self._body(notification), self._key)

    def close(self) -> None:
        """Called after every batch; keeps the session so the next batch reuses its connections."""

    def shutdown(self) -> None:
        """Close the session and its connections; a later send opens a new one.

        Call it from a thread, not from a coroutine on the session's loop.
        """
        session, loop = self._session, self._session_loop
        self._session = self._session_loop = None
        if session is None or loop is None or loop.is_closed():
            return
        eventloop.finish_on(loop, session.close())

    def _check_host(self, host: str) -> None:
        refusal = self._policy.check_literal(host)
        if refusal is not None:
            raise InvalidNotification(refusal)
        if legacy_ipv4(host):
            raise InvalidNotification(
                f"recipient host {host} is an IPv4 address in a legacy short or numeric form, "
                "which is not sent to; write it as four decimal numbers, e.g. 203.0.113.7"
            )

    def _client(self) -> aiohttp.ClientSession:
        """The session of the running loop; made on first use, since it belongs to one loop."""
        loop = asyncio.get_running_loop()
        if self._session is not None and self._session_loop is not loop:
            if self._session_loop is not None and not self._session_loop.is_closed():
                raise RuntimeError("WebhookProvider is already sending on another event loop")
            self._session = None  # its loop is gone, and its connections with it
        if self._session is None:
            self._session, self._session_loop = self._new_session(), loop
        return self._session

    def _new_session(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=_pool_size(self._settings),
            keepalive_timeout=KEEPALIVE_SECONDS,
            resolver=GuardedResolver(self._policy),
            socket_factory=guarded_socket(self._policy),
            happy_eyeballs_delay=None,  # one address after the other, as the check returned them
            ssl=httpx.create_ssl_context(),  # the CA bundle of notifier's other HTTPS calls
        )
        return aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeouts,
            headers={"User-Agent": _user_agent()},
            cookie_jar=aiohttp.DummyCookieJar(),  # one receiver's cookies go nowhere
            auto_decompress=False,  # the error text is read raw, never decompressed
            trust_env=False,  # no HTTPS_PROXY: the address check must see the real target
        )

    @staticmethod
    def _body(n: Notification) -> bytes:
        document = {"id": n.id, "subject": n.subject, "body": n.body, "payload": n.payload}
        return json.dumps(document, separators=(",", ":")).encode()


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
