"""The ``email`` channel: one message per row over SMTP, on the event loop, through a pool of
connections to the relay kept across batches (``smtp_pool``), pipelined where the relay offers it
(``smtp_client``).

Replies are classified by their code: 4xx asks to try later, 5xx refuses for good. Anything that
is the server's or the deployment's fault (network, timeout, TLS, login) is a ``Retry``, so an
operator can fix it before the rows run out of attempts. A 5xx reply to ``RCPT TO`` that says the
mailbox itself is bad (see ``_mailbox_gone``) is a ``Permanent(suppress=True)``: the recipient
goes on the suppression list. A relay that refuses us for overload (``421``, a refused or reset
connection) shrinks the pool for a while, and the row is handed back without using an attempt
(a throttled ``Retry`` of scope ``smtp:host:port``, which holds that relay back for every worker).

Every message carries ``Message-ID: <notification-{id}@{domain of email_from}>``, the same on
every attempt, so a receiver can drop the duplicate a retry may cause.

So that a relay's delivery reports (``notifier events``) find their row, every message also
names it in ``X-Notifier-Id: {id}`` and in the metadata headers the common relays hand back in
their events: ``X-Mailgun-Variables`` (Mailgun's ``user-variables``), ``X-SMTPAPI``
``unique_args`` (SendGrid) and ``X-PM-Metadata-notifier-id`` (Postmark); a row's own header of
one of those names wins over notifier's. Campaign rows and rows whose ``payload.unsubscribe``
is true carry RFC 8058 one-click ``List-Unsubscribe`` headers (``notifier.unsubscribe``), an
opt-out of the row's category, unless the row sets its own ``List-Unsubscribe``; a row without
a category is transactional and carries none.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import ssl
from email.utils import formatdate, parseaddr
from typing import ClassVar

from notifier import eventloop, unsubscribe
from notifier.models import Notification, truncate
from notifier.providers import hostname, smtp_client
from notifier.providers.base import InvalidNotification, Outcome, Permanent, Provider, Retry, Sent
from notifier.providers.email_message import (
    ADDRESS,
    build,
    check_headers,
    check_sender,
    check_text,
    json_type,
    parse_mailbox,
)
from notifier.providers.smtp_client import (
    AuthError,
    ClosedAtGreeting,
    Connection,
    Disconnected,
    ReplyError,
)
from notifier.providers.smtp_pool import Pool
from notifier.settings import Settings, SmtpTls

_ADDRESS = re.compile(ADDRESS)
# RFC 3463 enhanced status code at the start of a reply's text, e.g. "5.1.1".
_ENHANCED = re.compile(rb"\s*([245])\.(\d{1,3})\.(\d{1,3})(?!\d)")
# Basic RCPT replies that mean the mailbox is unusable when no enhanced code says otherwise:
# 550 mailbox unavailable, 551 user not local, 553 mailbox name not allowed.
_MAILBOX_CODES = frozenset({550, 551, 553})
#: How long every worker holds back from a relay that refused us for overload: long enough
#: for its connections to drain, short enough that the rows are barely late.
THROTTLE_SECONDS = 2.0
_SMTP_FAULTS = (smtp_client.SmtpError, OSError, TimeoutError)


class EmailProvider(Provider):
    """Sends through the SMTP relay of ``NOTIFIER_SMTP_*``, on the worker's event loop.

    The pool of connections (``smtp_pool.Pool``) is made on first use on the loop that sends,
    and kept across batches: ``close`` (after every batch) leaves it, ``shutdown`` closes it.
    The blocking ``send`` (rows with a guard, in threads) waits on that loop for ``send_async``:
    one pool, one classification of the relay's answers.
    """

    channel: ClassVar[str] = "email"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self._settings = s = settings
        self._where = f"{s.smtp_host}:{s.smtp_port}"
        self._scope = f"smtp:{self._where}"
        self._sender = parseaddr(s.email_from)[1] or s.email_from
        _, at, domain = self._sender.rpartition("@")
        self._domain = domain if at and domain else "notifier.localhost"
        self._ssl = ssl.create_default_context() if s.smtp_tls is not SmtpTls.none else None
        # Looked up once here: a reverse DNS query would block the loop.
        self._local_hostname = socket.getfqdn()
        self._pool: Pool | None = None
        self._pool_loop: asyncio.AbstractEventLoop | None = None
        try:  # a sender every message would be refused for is the deployment's to fix, now
            check_sender(s.email_from, self._domain)
        except InvalidNotification as exc:
            raise ValueError(f"NOTIFIER_EMAIL_FROM {s.email_from!r} is unusable: {exc}") from None

    # -- Provider --------------------------------------------------------------------------------

    def validate(self, notification: Notification) -> None:
        self.validate_recipient(notification.recipient)
        subject = notification.subject
        if subject is not None:
            check_text("subject", subject)
            if len(subject) > 998:
                raise InvalidNotification(f"subject is {len(subject)} characters; at most 998")
        html = notification.payload.get("html")
        if html is not None and not isinstance(html, str):
            raise InvalidNotification(
                f'payload.html must be a string of HTML like "<p>Hi</p>", not {json_type(html)}'
            )
        check_headers(notification.payload.get("headers"))

    def validate_recipient(self, recipient: str) -> None:
        # An address the pattern takes passes every check before it (no space, line break,
        # list or display name can match): only its domain is left, and most are.
        if len(recipient) <= 254 and _ADDRESS.fullmatch(recipient):
            self._check_domain(recipient)
            return
        shown = repr(recipient[:100])
        if not recipient.strip():
            raise InvalidNotification("recipient is empty; give the email address to send to")
        if "\r" in recipient or "\n" in recipient:
            raise InvalidNotification("recipient contains a line break; give one plain address")
        if "," in recipient or ";" in recipient:
            raise InvalidNotification(f"recipient {shown} lists several; send one row per address")
        if "<" in recipient or ">" in recipient:
            raise InvalidNotification(f"recipient {shown}: give the bare address, no display name")
        if len(recipient) > 254:
            raise InvalidNotification(f"recipient is {len(recipient)} characters; at most 254")
        if not _ADDRESS.fullmatch(recipient):
            raise InvalidNotification(
                f"recipient {shown} is not a plain ASCII email address like 'ada@example.com' "
                "(give an internationalised domain in punycode)"
            )

    @staticmethod
    def _check_domain(recipient: str) -> None:
        domain_problem = hostname.problem(recipient.rpartition("@")[2])
        if domain_problem is not None:
            raise InvalidNotification(
                f"recipient {recipient[:100]!r} is not a valid email address: its domain"
                f" {domain_problem}"
            )

    def throttle_scope(self, notification: Notification) -> str | None:
        """The relay: its 421 or refused connection holds back every worker's email rows."""
        return self._scope

    def send(self, notification: Notification) -> Outcome:
        """``send_async``, waited for on the process's event loop: for a caller in a thread."""
        return eventloop.run(self.send_async(notification))

    async def send_async(self, notification: Notification) -> Outcome:
        """Send the row; every failure becomes an outcome, within ``longest_send_seconds``."""
        try:
            self.validate_recipient(notification.recipient)  # it goes into RCPT TO as is
        except InvalidNotification as exc:
            return Permanent(truncate(f"invalid notification: {exc}"))
        total = self._settings.longest_send_seconds
        budget = asyncio.timeout(total)
        try:
            async with budget:
                return await self._deliver(notification)
        except TimeoutError:
            if not budget.expired():
                raise
            return Retry(f"SMTP send to {self._where} took more than {total:g}s in all")

    def close(self) -> None:
        """Called after every batch; keeps the pool so the next batch reuses its connections."""

    def shutdown(self) -> None:
        """Close the pool's connections; a later send makes a new pool. From a thread only."""
        pool, loop = self._pool, self._pool_loop
        self._pool = self._pool_loop = None
        if pool is None or loop is None or loop.is_closed():
            return
        if not loop.is_running():
            loop.run_until_complete(pool.close())
            return
        closing = asyncio.run_coroutine_threadsafe(pool.close(), loop)
        try:  # each QUIT has its own timeout; this is only the margin above them
            closing.result(timeout=self._settings.smtp_timeout * 2 + 5)
        except TimeoutError:
            closing.cancel()

    # -- connections -----------------------------------------------------------------------------

    async def _deliver(self, n: Notification) -> Outcome:
        """One transaction on a pooled connection. The relay may have dropped a pooled one while
        it sat idle: that shows on ``MAIL``, before any of the message went out, so one fresh
        try is safe. A timeout is not retried: the relay is there but slow.

        The message is built once a connection is in hand: building takes the loop's CPU for a
        while, better spent while other connections wait for their answers than before any of
        a wave of sends has gone out.
        """
        pool = self._pool_here()
        message_id = f"<notification-{n.id}@{self._domain}>"
        content: bytes | None = None
        for last_try in (False, True):
            try:
                conn, reused = await pool.take()
            except _SMTP_FAULTS as exc:
                return self._trouble(exc, pool, connecting=True)
            try:
                if content is None:
                    content = self._compose(n, message_id)
                done = await conn.transaction(self._sender, n.recipient, content)
            except InvalidNotification as exc:
                pool.give_back(conn)  # nothing was said on it
                return Permanent(truncate(f"invalid notification: {exc}"))
            except _SMTP_FAULTS as exc:
                pool.discard(conn)
                if reused and not last_try and conn.step == "mail" and _dropped(exc):
                    pool.discard_idle()
                    continue
                return self._trouble(exc, pool)
            except BaseException:  # cancelled: the connection may be mid-transaction
                pool.discard(conn)
                raise
            code = done.reply.code
            if reused and not last_try and done.step == "mail" and code == 421:
                pool.discard(conn)
                pool.discard_idle()
                continue
            return await self._settle(pool, conn, done, message_id)
        raise AssertionError("unreachable: the last try returns")

    async def _settle(
        self, pool: Pool, conn: Connection, done: smtp_client.Outcome, message_id: str
    ) -> Outcome:
        if done.accepted:
            pool.give_back(conn)
            return Sent(message_id)
        code, text = done.reply.code, done.reply.text
        if code == 421:  # the relay is closing the channel: too busy for us
            pool.discard(conn)
            return self._overloaded(pool, f"SMTP {_reply_text(code, text)}")
        try:
            kept = await conn.rset()
        except _SMTP_FAULTS:
            kept = False
        except BaseException:
            pool.discard(conn)
            raise
        if kept:
            pool.give_back(conn)
        else:
            pool.discard(conn)
        return _refused(code, text, at_rcpt=done.step == "rcpt")

    def _pool_here(self) -> Pool:
        """The pool of the running loop; made on first use, since it belongs to one loop."""
        loop = asyncio.get_running_loop()
        if self._pool is None or self._pool_loop is not loop:
            s = self._settings
            self._pool = Pool(self._open, s.smtp_max_connections, s.smtp_messages_per_connection)
            self._pool_loop = loop
        return self._pool

    async def _open(self) -> Connection:
        s = self._settings
        return await smtp_client.connect(
            s.smtp_host,
            s.smtp_port,
            timeout=s.smtp_timeout,
            local_hostname=self._local_hostname,
            implicit_tls=self._ssl if s.smtp_tls is SmtpTls.ssl else None,
            starttls=self._ssl if s.smtp_tls is SmtpTls.starttls else None,
            login=(s.smtp_username, s.smtp_password or "") if s.smtp_username else None,
        )

    # -- messages and answers --------------------------------------------------------------------

    def _compose(self, n: Notification, message_id: str) -> bytes:
        headers = dict(n.payload.get("headers") or {})
        own = {name.lower() for name in headers}
        for name, value in self._feedback_headers(n).items():
            if name.lower() not in own:
                headers[name] = value
        reply_to = next((k for k in headers if k.lower() == "reply-to"), None)
        return build(
            sender=self._settings.email_from,
            recipient=n.recipient,
            subject=n.subject or "",
            date=formatdate(usegmt=True),
            message_id=message_id,
            headers=headers,
            reply_to=None if reply_to is None else parse_mailbox(reply_to, headers.pop(reply_to)),
            body=n.body or "",
            html=n.payload.get("html"),
        )

    def _feedback_headers(self, n: Notification) -> dict[str, str]:
        """Headers that let delivery reports and unsubscribes find their way back."""
        found = {
            "X-Notifier-Id": str(n.id),
            "X-Mailgun-Variables": json.dumps({"notifier_id": str(n.id)}),
            "X-SMTPAPI": json.dumps({"unique_args": {"notifier_id": str(n.id)}}),
            "X-PM-Metadata-notifier-id": str(n.id),
        }
        # A transactional row (no category) has nothing to opt out of: no header.
        if n.payload.get("unsubscribe") is True or n.payload.get("campaign") is not None:
            found |= unsubscribe.headers(self._settings, n.channel, n.recipient, n.category)
        return found

    def _overloaded(self, pool: Pool, error: str) -> Retry:
        pool.shrink()
        return Retry(
            truncate(f"{error} (relay {self._where} overloaded: fewer connections for a while)"),
            retry_after=THROTTLE_SECONDS,
            throttled=True,
            scope=self._scope,
        )

    def _trouble(self, exc: BaseException, pool: Pool, *, connecting: bool = False) -> Retry:
        """Name the server and what went wrong with it, so the operator knows where to look."""
        where, s = self._where, self._settings
        if connecting and _refuses_connections(exc):
            return self._overloaded(pool, f"SMTP server {where} refused a connection: {exc}")
        if isinstance(exc, TimeoutError):
            return Retry(f"SMTP timeout after {s.smtp_timeout:g}s talking to {where}")
        if isinstance(exc, AuthError):
            return Retry(
                truncate(
                    f"SMTP login as {s.smtp_username!r} refused by {where}: "
                    f"{_reply_text(exc.reply.code, exc.reply.text)}; "
                    "check NOTIFIER_SMTP_USERNAME and NOTIFIER_SMTP_PASSWORD"
                )
            )
        if isinstance(exc, ReplyError):
            return Retry(truncate(f"SMTP server {where} answered {exc}"))
        if isinstance(exc, Disconnected):
            return Retry(truncate(f"SMTP server {where} closed the connection: {exc}"))
        if isinstance(exc, ssl.SSLError):
            return Retry(truncate(f"TLS with SMTP server {where} failed: {exc}"))
        if isinstance(exc, ConnectionRefusedError):
            return Retry(f"cannot reach SMTP server {where}: connection refused")
        if isinstance(exc, OSError):
            return Retry(truncate(f"cannot reach SMTP server {where}: {exc.strerror or exc}"))
        return Retry(truncate(f"SMTP server {where}: {exc}"))


def _refuses_connections(exc: BaseException) -> bool:
    """A relay that is there but takes no more of our connections: it refused or reset one,
    closed it before its greeting, or answered 421 while it was set up ("too many
    connections")."""
    if isinstance(exc, ConnectionRefusedError | ConnectionResetError):
        return True
    if isinstance(exc, ReplyError):
        return exc.reply.code == 421
    return isinstance(exc, ClosedAtGreeting)


def _dropped(exc: BaseException) -> bool:
    return isinstance(exc, Disconnected | ConnectionResetError | BrokenPipeError)


def _refused(code: int, reply: bytes, *, at_rcpt: bool = False) -> Outcome:
    text = f"SMTP {_reply_text(code, reply)}"
    if 500 <= code < 600:
        return Permanent(truncate(text), suppress=at_rcpt and _mailbox_gone(code, reply))
    return Retry(truncate(text))


def _mailbox_gone(code: int, reply: bytes) -> bool:
    """Whether a 5xx reply to ``RCPT TO`` refuses the mailbox itself, not this message or us.

    An enhanced status code decides when there is one: ``5.1.x`` (bad mailbox, bad domain, bad
    address syntax, moved) condemns the address, except ``5.1.7``/``5.1.8``, which are about
    *our* sender address (Postfix, by default, delays such rejections until ``RCPT TO``).
    ``550 5.7.1`` (relaying denied, our IP on a blocklist) or ``552 5.2.2`` (mailbox full) say
    nothing lasting about the recipient. Without an enhanced code, 550, 551 and 553 do.
    Suppressing too eagerly stops mail to a real person for good, so nothing else is.
    """
    enhanced = _ENHANCED.match(reply)
    if enhanced is not None:
        kind, subject, detail = enhanced.groups()
        return kind == b"5" and subject == b"1" and detail not in (b"7", b"8")
    return code in _MAILBOX_CODES


def _reply_text(code: int, reply: bytes | str) -> str:
    text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else reply
    return f"{code} {text}".strip()
