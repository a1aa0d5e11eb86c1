"""What the email channel's HTTP providers share (``sendgrid``, ``mailgun``, ``postmark``): the
message a row becomes, how rows are cut into requests, and how an answer becomes outcomes.

Each is a provider of the ``email`` channel under its own name, chosen like any other by
``NOTIFIER_FAILOVER`` (``email=sendgrid`` or ``email=sendgrid,email``). A row is checked as the
SMTP provider checks it (``email_rows.check_notification``), and its headers are the ones
SMTP would write: ``Message-ID: <notification-{id}@{domain of email_from}>``, ``X-Notifier-Id``,
the one-click ``List-Unsubscribe`` pair of campaign rows, and the row's own
``payload.headers``; before anything is sent they are written and parsed back
(``email_message.build``), so a CR LF in a subject can never become a header at the provider.
The row's id also goes in the provider's own metadata, where its events (``notifier events``)
read it back.

Sends are coroutines on the worker process's event loop, one ``aiohttp`` session per provider
kept across batches (``notifier.providers.http.post``). ``send_batch_async`` groups rows by
``batch_key``, cuts each group into requests of at most ``max_batch`` rows to distinct
addresses, sends those requests at once and splits every answer back into one outcome per row.
A request refused as a whole for a reason one row may cause (a 400 about one address) is not
every row's failure: the rows it does not blame are sent again once, alone; a failure of the
request itself (timeout, 5xx, 429) is every row's ``Retry``.

Bad credentials, a wrong API base or a sender the provider refuses are the operator's to fix:
a ``Retry`` naming the setting, as the SMS and push providers answer, so the rows wait for the
fix instead of dying.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import aiohttp
import httpx
import yarl

from notifier import eventloop
from notifier.models import Notification, truncate
from notifier.providers.base import InvalidNotification, Outcome, Permanent, Provider, Retry, Sent
from notifier.providers.email_message import build, check_sender, date_header
from notifier.providers.email_rows import (
    check_notification,
    check_recipient,
    list_unsubscribe,
    row_headers,
    sender_domain,
)
from notifier.providers.email_rows import message_id as row_message_id
from notifier.providers.http import LoopSession, parse_retry_after, post, read_capped
from notifier.settings import Settings

log = logging.getLogger(__name__)

#: The longest wait a provider's rate-limit answer is believed for; longer is a broken clock.
MAX_RETRY_AFTER = 86_400.0
#: Mark of a Mailgun recipient variable; a row holding it cannot share a request (``mailgun``).
RECIPIENT_VARIABLE = "%recipient"


@dataclass(frozen=True, slots=True)
class Message:
    """One email row as an HTTP provider sends it, its headers checked."""

    row: Notification
    recipient: str
    subject: str
    text: str
    html: str | None
    #: Message-ID, X-Notifier-Id, List-Unsubscribe and the row's own, in that order
    headers: dict[str, str]
    reply_to: tuple[str, str] | None

    @property
    def id(self) -> str:
        """notifier's row id, as the provider's metadata carries it."""
        return str(self.row.id)


@dataclass(frozen=True, slots=True)
class Request:
    url: yarl.URL
    body: bytes
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class Reply:
    """A provider's answer, its body read up to the provider's ``max_response_bytes``."""

    status: int
    headers: Mapping[str, str]
    raw: bytes

    def json(self) -> Any:
        """The body as JSON, or ``None`` when it is not (or too deep to parse)."""
        try:
            return json.loads(self.raw)
        except (ValueError, RecursionError):
            return None

    def text(self, limit: int = 300) -> str:
        return truncate(self.raw.decode("utf-8", errors="replace"), limit) or "(empty body)"


#: What an answer means for each row of its request, in order; ``None``: the row was refused
#: with the others but not for itself, and is sent again alone.
Outcomes = list[Outcome | None]


def retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds a rate-limited answer asks for: ``Retry-After``, else ``X-RateLimit-Reset``
    (a Unix time in seconds or milliseconds, or seconds from now); at most a day."""
    wait = parse_retry_after(headers.get("retry-after"))
    reset = (headers.get("x-ratelimit-reset") or "").strip()
    if wait is None and reset.isdigit() and len(reset) < 20:
        value = float(reset)
        if value > 1e11:  # milliseconds since the epoch
            value /= 1000
        wait = max(0.0, value - (time.time() if now is None else now)) if value > 1e9 else value
    return None if wait is None else min(wait, MAX_RETRY_AFTER)


class EspProvider(Provider):
    """An email provider's HTTP API; subclasses say where requests go, what they carry and
    what the answers mean (``_configuration_error``, ``_request``, ``_outcomes``)."""

    channel: ClassVar[str] = "email"
    #: how errors name the provider
    label: ClassVar[str]
    #: the settings that hold its credentials, named in errors
    credentials: ClassVar[str]
    #: the settings that say where its API is, named in errors
    endpoint: ClassVar[str]
    #: bytes of an answer that are read; more is not the provider's
    max_response_bytes: ClassVar[int] = 65_536
    #: bytes of message content one request may carry (the provider's limit, less a margin)
    max_request_bytes: ClassVar[int] = 20_000_000

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self._settings = settings
        self._domain = sender_domain(settings.email_from)
        self._misconfigured = self._configuration_error()
        if self._misconfigured is None:
            try:
                check_sender(settings.email_from, self._domain)
            except InvalidNotification as exc:
                self._misconfigured = f"NOTIFIER_EMAIL_FROM is unusable: {exc}"
        t = settings.esp_timeout
        self._timeouts = aiohttp.ClientTimeout(total=2 * t, connect=t, sock_connect=t, sock_read=t)
        self._session = LoopSession(self._new_session, type(self).__name__)

    # -- what a subclass says --------------------------------------------------------------------

    def _configuration_error(self) -> str | None:
        raise NotImplementedError

    def _request(self, messages: Sequence[Message]) -> Request:
        raise NotImplementedError

    def _outcomes(self, messages: Sequence[Message], reply: Reply) -> Outcomes:
        raise NotImplementedError

    def _size(self, message: Message) -> int:
        """Bytes ``message`` adds to a request (the shared content counted by each row)."""
        return len(message.text) + len(message.html or "") + 2048

    # -- Provider --------------------------------------------------------------------------------

    def problem(self) -> str | None:
        return self._misconfigured

    def validate(self, notification: Notification) -> None:
        check_notification(notification)
        html = notification.payload.get("html")
        if not (notification.body or "").strip() and not html:
            raise InvalidNotification(
                f"body and payload.html are both empty; {self.label} sends no empty email"
            )

    def validate_recipient(self, recipient: str) -> None:
        check_recipient(recipient)

    def send(self, notification: Notification) -> Outcome:
        """``send_async``, waited for on the process's event loop: for a caller in a thread."""
        return eventloop.run(self.send_async(notification))

    async def send_async(self, notification: Notification) -> Outcome:
        return (await self.send_batch_async([notification]))[0]

    async def send_batch_async(self, rows: Sequence[Notification]) -> list[Outcome]:
        """One outcome per row, in order. Rows are grouped by ``batch_key`` here, whatever
        the caller did, so that any rows may be passed; each request is within the limits."""
        if self._misconfigured is not None:
            return [Retry(self._misconfigured) for _ in rows]
        outcomes: list[Outcome | None] = [None] * len(rows)
        groups: dict[Hashable, list[tuple[int, Message]]] = {}
        for i, n in enumerate(rows):
            try:
                message = self._compose(n)
            except InvalidNotification as exc:
                outcomes[i] = Permanent(truncate(f"invalid notification: {exc}"))
                continue
            key = self.batch_key(n) if self.max_batch > 1 else None
            groups.setdefault(("row", i) if key is None else ("key", key), []).append((i, message))
        chunks = [c for group in groups.values() for c in self._chunks(group)]
        answers = await asyncio.gather(*(self._exchange([m for _, m in c]) for c in chunks))
        for chunk, answer in zip(chunks, answers, strict=True):
            for (i, _), outcome in zip(chunk, answer, strict=True):
                outcomes[i] = outcome
        return [o if o is not None else Retry("not sent") for o in outcomes]

    def close(self) -> None:
        """Called after every batch; keeps the session so the next batch reuses connections."""

    def shutdown(self) -> None:
        """Close the session and its connections; call it from a thread, not the loop."""
        self._session.close()

    # -- messages and requests -------------------------------------------------------------------

    def _compose(self, n: Notification) -> Message:
        """The row's message; ``InvalidNotification`` if a header would not read back as
        written (the same check, by the same code, as every SMTP message gets)."""
        self.validate(n)
        message_id = row_message_id(n, self._domain)
        feedback = {"X-Notifier-Id": str(n.id)} | list_unsubscribe(self._settings, n)
        headers, reply_to = row_headers(n, feedback)
        subject = n.subject or ""
        build(
            sender=self._settings.email_from,
            recipient=n.recipient,
            subject=subject,
            date=date_header(0),
            message_id=message_id,
            headers=headers,
            reply_to=reply_to,
            body="",  # only the headers are checked; the provider writes the body
            html=None,
        )
        html = n.payload.get("html")
        return Message(
            row=n,
            recipient=n.recipient,
            subject=subject,
            text=n.body or "",
            html=html if isinstance(html, str) and html else None,
            headers={"Message-ID": message_id, **headers},
            reply_to=reply_to,
        )

    def content_key(self, n: Notification, *more: Hashable) -> Hashable:
        """What rows must share to go in one request: the sender, body, html, ``Reply-To``
        and ``more``. The texts themselves, not a digest of them: a campaign's rows are grouped
        by hashing each body once, in C, instead of encoding and digesting it."""
        headers = n.payload.get("headers") or {}
        reply_to = next((v for k, v in headers.items() if k.lower() == "reply-to"), None)
        return (
            self._settings.email_from,
            n.body or "",
            _text_or_json(n.payload.get("html")),
            _text_or_json(reply_to),
            *more,
        )

    def _chunks(self, group: list[tuple[int, Message]]) -> Iterable[list[tuple[int, Message]]]:
        """``group`` cut into requests of at most ``max_batch`` rows and ``max_request_bytes``,
        each to distinct addresses (a provider refuses or merges a repeated one)."""
        pending = group
        while pending:
            chunk: list[tuple[int, Message]] = []
            later: list[tuple[int, Message]] = []
            seen: set[str] = set()
            size = 0
            for item in pending:
                address, cost = item[1].recipient.lower(), self._size(item[1])
                full = len(chunk) >= self.max_batch or (
                    chunk and size + cost > self.max_request_bytes
                )
                if full or address in seen:
                    later.append(item)
                    continue
                chunk.append(item)
                seen.add(address)
                size += cost
            yield chunk
            pending = later

    async def _exchange(self, messages: list[Message], again: bool = True) -> list[Outcome]:
        """Send one request; rows refused with it but not for themselves go again, once: the
        others together if the answer blamed some, else each alone."""
        answer = await self._post(messages)
        pending = [m for m, o in zip(messages, answer, strict=True) if o is None]
        if not pending:
            return [o for o in answer if o is not None]
        if not again or len(messages) == 1:
            return [
                o
                if o is not None
                else Retry(f"{self.label} refused the request this message was in; sent later")
                for o in answer
            ]
        if len(pending) < len(messages):
            retried = iter(await self._exchange(pending, again=False))
        else:
            singles = await asyncio.gather(*(self._exchange([m], again=False) for m in pending))
            retried = iter(outcome for [outcome] in singles)
        return [o if o is not None else next(retried) for o in answer]

    async def _post(self, messages: Sequence[Message]) -> Outcomes:
        request = self._request(messages)
        replies: list[Outcomes] = []

        async def answer(response: aiohttp.ClientResponse) -> Outcome:
            raw = await read_capped(response, self.max_response_bytes)
            replies.append(self._outcomes(messages, Reply(response.status, response.headers, raw)))
            return Sent()  # stands for the outcomes, which ``replies`` carries

        failed = await post(
            self._session.get(),
            request.url,
            "",
            request.body,
            None,
            headers=request.headers,
            answer=answer,
        )
        if replies:
            return replies[0]
        if isinstance(failed, Permanent):  # the URL itself: the operator's to fix
            failed = Retry(f"{failed.error}; check {self.endpoint}")
        return [failed] * len(messages)

    # -- what answers mean -----------------------------------------------------------------------

    def refused(self, reply: Reply, error: str) -> Outcome | None:
        """What an answer every provider gives means, or ``None`` for the provider to decide:
        429 is throttling, 408 and 5xx the provider's trouble, 401/403 our credentials, a
        redirect, 404 or 405 a wrong API base; all retried."""
        status = reply.status
        if status == 429:
            return Retry(error, retry_after(reply.headers), throttled=True)
        if status == 408 or status >= 500:
            return Retry(error, retry_after(reply.headers))
        if status in (401, 403):
            return Retry(truncate(f"{error}; check {self.credentials}"))
        if 300 <= status < 400 or status in (404, 405):
            return Retry(truncate(f"{error}; check {self.endpoint}"))
        return None

    def accepted(self, reply: Reply, message_id: object, what: str) -> Sent:
        """A 2xx: the provider took the message, whatever its body says. Without a usable id
        it is still ``Sent`` (a retry would send a second copy), and logged."""
        if isinstance(message_id, str) and message_id and len(message_id) <= 200:
            return Sent(message_id)
        log.warning(
            "%s accepted a request (HTTP %s) but its answer names no %s: %s",
            self.label,
            reply.status,
            what,
            reply.text(200),
        )
        return Sent(None)

    def _new_session(self) -> aiohttp.ClientSession:
        s = self._settings
        connector = aiohttp.TCPConnector(
            limit=s.async_send_concurrency + s.send_concurrency,
            ssl=httpx.create_ssl_context(),  # the CA bundle of notifier's other HTTPS calls
        )
        return aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeouts,
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,  # answers are read raw and capped, never inflated
        )


def _text_or_json(value: object) -> Hashable:
    """A row's text as it is, anything else (a number, a list: refused later) as its JSON in a
    tuple, which no text equals."""
    return value if value is None or isinstance(value, str) else (json.dumps(value, default=str),)


def missing(label: str, **values: str | None) -> str | None:
    """``"SendGrid is not configured: set NOTIFIER_SENDGRID_API_KEY"`` for the unset ones."""
    names = [f"NOTIFIER_{name.upper()}" for name, value in values.items() if not value]
    return f"{label} is not configured: set {', '.join(names)}" if names else None
