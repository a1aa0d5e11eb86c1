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

What a row must hold and the message it becomes (the ``Message-ID``, the headers that name the
row for delivery reports, ``List-Unsubscribe``) are ``email_rows.EmailRows``'s, shared with
SES and the ESPs' API providers.
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl

from notifier import eventloop
from notifier.models import Notification, truncate
from notifier.providers import smtp_client
from notifier.providers.base import InvalidNotification, Outcome, Permanent, Retry, Sent
from notifier.providers.email_rows import EmailRows
from notifier.providers.smtp_client import (
    AuthError,
    ClosedAtGreeting,
    Connection,
    Disconnected,
    ReplyError,
)
from notifier.providers.smtp_pool import Pool
from notifier.settings import Settings, SmtpTls

# RFC 3463 enhanced status code at the start of a reply's text, e.g. "5.1.1".
_ENHANCED = re.compile(rb"\s*([245])\.(\d{1,3})\.(\d{1,3})(?!\d)")
# Basic RCPT replies that mean the mailbox is unusable when no enhanced code says otherwise:
# 550 mailbox unavailable, 551 user not local, 553 mailbox name not allowed.
_MAILBOX_CODES = frozenset({550, 551, 553})
#: How long every worker holds back from a relay that refused us for overload: long enough
#: for its connections to drain, short enough that the rows are barely late.
THROTTLE_SECONDS = 2.0
_SMTP_FAULTS = (smtp_client.SmtpError, OSError, TimeoutError)


class EmailProvider(EmailRows):
    """Sends through the SMTP relay of ``NOTIFIER_SMTP_*``, on the worker's event loop.

    The pool of connections (``smtp_pool.Pool``) is made on first use on the loop that sends,
    and kept across batches: ``close`` (after every batch) leaves it, ``shutdown`` closes it.
    The blocking ``send`` (rows with a guard, in threads) waits on that loop for ``send_async``:
    one pool, one classification of the relay's answers.
    """

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self._settings = s = settings
        self._where = f"{s.smtp_host}:{s.smtp_port}"
        self._scope = f"smtp:{self._where}"
        self._ssl = _tls_context(s) if s.smtp_tls is not SmtpTls.none else None
        # Looked up once here: a reverse DNS query would block the loop.
        self._local_hostname = socket.getfqdn()
        self._pool: Pool | None = None
        self._pool_loop: asyncio.AbstractEventLoop | None = None

    # -- Provider --------------------------------------------------------------------------------

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
        message_id = self._message_id(n)
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


def _tls_context(settings: Settings) -> ssl.SSLContext:
    """Verifies the server's certificate and host name, against ``smtp_ca_file`` when set."""
    try:
        return ssl.create_default_context(cafile=settings.smtp_ca_file)
    except OSError as exc:  # a missing file, or one without a PEM certificate (ssl.SSLError)
        raise ValueError(
            f"NOTIFIER_SMTP_CA_FILE {str(settings.smtp_ca_file)!r} is unusable: {exc}"
        ) from None


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
