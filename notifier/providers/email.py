"""The ``email`` channel: one message per row over SMTP, on connections reused across a batch.

Replies are classified by their code: 4xx asks to try later, 5xx refuses for good. Anything that
is the server's or the deployment's fault (network, timeout, TLS, login) is a ``Retry``, so an
operator can fix it before the rows run out of attempts. A 5xx reply to ``RCPT TO`` that says the
mailbox itself is bad (see ``_mailbox_gone``) is a ``Permanent(suppress=True)``: the recipient
goes on the suppression list.

What a row must hold and the message it becomes (the ``Message-ID``, the headers that name the
row for delivery reports, ``List-Unsubscribe``) are ``email_rows.EmailRows``'s, shared with
the ESPs' API providers.
"""

from __future__ import annotations

import re
import smtplib
import socket
import ssl
import threading

from notifier.models import Notification, truncate
from notifier.providers.base import InvalidNotification, Outcome, Permanent, Retry, Sent
from notifier.providers.email_rows import EmailRows
from notifier.settings import Settings, SmtpTls

# RFC 3463 enhanced status code at the start of a reply's text, e.g. "5.1.1".
_ENHANCED = re.compile(rb"\s*([245])\.(\d{1,3})\.(\d{1,3})(?!\d)")
# Basic RCPT replies that mean the mailbox is unusable when no enhanced code says otherwise:
# 550 mailbox unavailable, 551 user not local, 553 mailbox name not allowed.
_MAILBOX_CODES = frozenset({550, 551, 553})


class EmailProvider(EmailRows):
    """Sends through the SMTP server of ``NOTIFIER_SMTP_*``; safe to call from many threads.

    Idle connections wait in a small pool between sends; a send takes one (or opens one) and
    puts it back once its transaction ended cleanly. ``close`` quits them after each batch.
    """

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self._settings = s = settings
        self._where = f"{s.smtp_host}:{s.smtp_port}"
        self._ssl = _tls_context(s) if s.smtp_tls is not SmtpTls.none else None
        # smtplib would look this up (a reverse DNS query, outside any timeout) per connection.
        self._local_hostname = socket.getfqdn()
        self._idle: list[smtplib.SMTP] = []
        self._lock = threading.Lock()

    # -- Provider --------------------------------------------------------------------------------

    def send(self, notification: Notification) -> Outcome:
        message_id = self._message_id(notification)
        try:
            content = self._compose(notification, message_id)
        except InvalidNotification as exc:
            return Permanent(truncate(f"invalid notification: {exc}"))
        try:
            conn, code, reply = self._begin()
        except (smtplib.SMTPException, OSError) as exc:
            return self._trouble(exc)
        at_rcpt = False
        try:
            if code == 250:
                code, reply = conn.rcpt(notification.recipient)
                at_rcpt = code not in (250, 251)
                if not at_rcpt:
                    code, reply = _data(conn, content)
                    if code == 250:
                        self._put_back(conn)
                        return Sent(message_id)
        except (smtplib.SMTPException, OSError) as exc:
            self._discard(conn)
            return self._trouble(exc)
        except BaseException:
            self._discard(conn)
            raise
        self._reset(conn, code)
        return _refused(code, reply, at_rcpt=at_rcpt)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            self._discard(conn, polite=True)

    # -- connections -----------------------------------------------------------------------------

    def _begin(self) -> tuple[smtplib.SMTP, int, bytes]:
        """A connection on which ``MAIL FROM`` has been answered.

        The server may have dropped a pooled connection while it sat idle. That shows on this
        first command, before any of the message went out, so one fresh try is safe. A timeout
        is not retried: the server is there but slow, and waiting twice helps nobody.
        """
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is not None:
            try:
                code, reply = conn.mail(self._sender)
            except smtplib.SMTPServerDisconnected as exc:
                self._discard(conn)
                if _timed_out(exc):
                    raise
            except BaseException:
                self._discard(conn)
                raise
            else:
                if code != 421:
                    return conn, code, reply
                self._discard(conn)
        conn = self._connect()
        try:
            code, reply = conn.mail(self._sender)
        except BaseException:
            self._discard(conn)
            raise
        return conn, code, reply

    def _connect(self) -> smtplib.SMTP:
        s, local = self._settings, self._local_hostname
        # The host goes to the constructor, which connects and refuses a greeting other than
        # 220 (closing the socket): TLS takes the name it checks the certificate against from
        # there, and a later connect() alone leaves it empty.
        host, port, timeout = s.smtp_host, s.smtp_port, s.smtp_timeout
        conn = (
            smtplib.SMTP_SSL(host, port, local_hostname=local, timeout=timeout, context=self._ssl)
            if s.smtp_tls is SmtpTls.ssl
            else smtplib.SMTP(host, port, local_hostname=local, timeout=timeout)
        )
        try:
            conn.ehlo_or_helo_if_needed()
            if s.smtp_tls is SmtpTls.starttls:
                conn.starttls(context=self._ssl)
                conn.ehlo_or_helo_if_needed()
            if s.smtp_username:
                conn.login(s.smtp_username, s.smtp_password or "")
        except BaseException:
            conn.close()
            raise
        return conn

    def _put_back(self, conn: smtplib.SMTP) -> None:
        with self._lock:
            if len(self._idle) < self._settings.send_concurrency:
                self._idle.append(conn)
                return
        self._discard(conn, polite=True)

    def _reset(self, conn: smtplib.SMTP, code: int) -> None:
        """After a refused transaction: ``RSET`` and keep the connection, or drop it."""
        if code != 421:  # 421: the server is closing the channel anyway
            try:
                if conn.rset()[0] == 250:
                    self._put_back(conn)
                    return
            except (smtplib.SMTPException, OSError):
                pass
        self._discard(conn)

    @staticmethod
    def _discard(conn: smtplib.SMTP, *, polite: bool = False) -> None:
        """Close ``conn``, saying QUIT first when it may still be alive; never raises."""
        try:
            if polite:
                conn.quit()
        except (smtplib.SMTPException, OSError):
            pass
        finally:
            conn.close()

    # -- messages and answers --------------------------------------------------------------------

    def _trouble(self, exc: BaseException) -> Retry:
        """Name the server and what went wrong with it, so the operator knows where to look."""
        where, s = self._where, self._settings
        if _timed_out(exc):
            return Retry(f"SMTP timeout after {s.smtp_timeout:g}s talking to {where}")
        if isinstance(exc, smtplib.SMTPAuthenticationError):
            return Retry(
                truncate(
                    f"SMTP login as {s.smtp_username!r} refused by {where}: "
                    f"{_reply_text(exc.smtp_code, exc.smtp_error)}; "
                    "check NOTIFIER_SMTP_USERNAME and NOTIFIER_SMTP_PASSWORD"
                )
            )
        if isinstance(exc, smtplib.SMTPResponseException):
            text = _reply_text(exc.smtp_code, exc.smtp_error)
            return Retry(truncate(f"SMTP server {where} answered {text}"))
        if isinstance(exc, smtplib.SMTPServerDisconnected):
            return Retry(truncate(f"SMTP server {where} closed the connection: {exc}"))
        if isinstance(exc, OSError):
            return Retry(truncate(f"cannot reach SMTP server {where}: {exc.strerror or exc}"))
        return Retry(truncate(f"SMTP server {where}: {type(exc).__name__}: {exc}"))


def _tls_context(settings: Settings) -> ssl.SSLContext:
    """Verifies the server's certificate and host name, against ``smtp_ca_file`` when set."""
    try:
        return ssl.create_default_context(cafile=settings.smtp_ca_file)
    except OSError as exc:  # a missing file, or one without a PEM certificate (ssl.SSLError)
        raise ValueError(
            f"NOTIFIER_SMTP_CA_FILE {str(settings.smtp_ca_file)!r} is unusable: {exc}"
        ) from None


def _data(conn: smtplib.SMTP, content: bytes) -> tuple[int, bytes]:
    """``DATA`` as a reply, whether the server refused the command or the message."""
    try:
        return conn.data(content)
    except smtplib.SMTPDataError as exc:  # raised when DATA itself is not answered 354
        error = exc.smtp_error
        return exc.smtp_code, error if isinstance(error, bytes) else error.encode()


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


def _timed_out(exc: BaseException | None) -> bool:
    """smtplib reports a read timeout as a disconnection; the cause is in the chain."""
    while exc is not None:
        if isinstance(exc, TimeoutError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
