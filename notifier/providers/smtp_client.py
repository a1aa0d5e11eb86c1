"""One SMTP connection on the event loop: greeting, EHLO, STARTTLS or implicit TLS, AUTH, and
mail transactions, pipelined (RFC 2920) when the server's EHLO offers ``PIPELINING``.

Written on an ``asyncio.Protocol`` rather than ``aiosmtplib``, which has STARTTLS, TLS, AUTH
and timeouts but sends one command per round trip: PIPELINING is what lets one connection carry
a message in two round trips (``MAIL``, ``RCPT`` and ``DATA`` together, then the content)
instead of four. Every step has a timeout (``timeout``: the connection, the TLS handshake and
each reply, the content's included); the caller bounds the whole send.

What the server sends is bounded too: a reply line over ``MAX_LINE`` bytes or a reply of more
than ``MAX_LINES`` lines ends the connection; bytes that arrive after the ``220`` to
``STARTTLS``, before the handshake, are refused (they would be taken as answers that came
through TLS: CVE-2011-0411's command injection).
"""

from __future__ import annotations

import asyncio
import base64
import re
import ssl
from collections import deque
from dataclasses import dataclass

MAX_LINE = 8192
MAX_LINES = 100
_REPLY_LINE = re.compile(rb"([1-5]\d\d)(?:([ -])(.*))?", re.DOTALL)
_LINE_ENDS = re.compile(rb"\r\n|\r|\n")
_LEADING_DOT = re.compile(rb"^\.", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Reply:
    code: int
    #: the reply's lines after their codes, joined by ``\n`` (as smtplib gives them)
    text: bytes


class SmtpError(Exception):
    """The connection cannot go on: what happened is in the message."""


class Disconnected(SmtpError):
    """The server closed the connection (or it broke) while an answer was awaited."""


class ClosedAtGreeting(Disconnected):
    """The server closed (or reset) the connection before its greeting: it takes no more."""


class ReplyError(SmtpError):
    """An answer, while setting the connection up, that is not the one expected."""

    def __init__(self, step: str, reply: Reply) -> None:
        super().__init__(f"{step}: {reply.code} {reply.text.decode('utf-8', 'replace')}".strip())
        self.step = step
        self.reply = reply


class AuthError(ReplyError):
    """The server refused the login."""


class _Wire(asyncio.Protocol):
    """Cuts what the server sends into replies, kept in order until read."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.replies: deque[Reply] = deque()
        self.failure: SmtpError | None = None
        self.closed = asyncio.get_running_loop().create_future()
        self._buffer = b""
        self._lines: list[bytes] = []
        self._waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while self.failure is None:
            end = self._buffer.find(b"\n")
            if end < 0:
                if len(self._buffer) > MAX_LINE:
                    self._fail(SmtpError(f"reply line longer than {MAX_LINE} bytes"))
                return
            line, self._buffer = self._buffer[:end].rstrip(b"\r"), self._buffer[end + 1 :]
            self._take(line)

    def _take(self, line: bytes) -> None:
        parts = _REPLY_LINE.fullmatch(line)
        if parts is None or len(line) > MAX_LINE or len(self._lines) >= MAX_LINES:
            self._fail(SmtpError(f"not an SMTP reply: {line[:100]!r}"))
            return
        code, more, text = parts.groups()
        self._lines.append((text or b"").strip(b" \t"))
        if more != b"-":
            self.replies.append(Reply(int(code), b"\n".join(self._lines)))
            self._lines = []
            self._wake()

    def pending_bytes(self) -> bool:
        return bool(self._buffer or self._lines or self.replies)

    def eof_received(self) -> bool:
        return False  # close our side too: nothing more can come

    def connection_lost(self, exc: Exception | None) -> None:
        if self.failure is None:
            self.failure = Disconnected(f"connection closed: {exc}" if exc else "connection closed")
        if not self.closed.done():
            self.closed.set_result(None)
        self._wake()

    def _fail(self, failure: SmtpError) -> None:
        self.failure = failure
        if self.transport is not None:
            self.transport.abort()
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def next_reply(self) -> Reply:
        while not self.replies:
            if self.failure is not None:
                raise self.failure
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return self.replies.popleft()


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a mail transaction ended: at which command (``mail``, ``rcpt``, ``data``: the
    ``DATA`` command or the content after it) and with which reply; ``data`` with a 250 is
    an accepted message."""

    step: str
    reply: Reply

    @property
    def accepted(self) -> bool:
        return self.step == "data" and self.reply.code == 250


class Connection:
    """An open, greeted (and, as configured, secured and logged-in) SMTP connection."""

    def __init__(self, wire: _Wire, host: str, timeout: float) -> None:
        self._wire = wire
        self._host = host
        self.timeout = timeout
        self.extensions: dict[str, str] = {}
        #: messages this connection carried (accepted or refused)
        self.messages = 0
        #: the command of the transaction whose answer is awaited: ``mail``, ``rcpt``, ``data``
        self.step = ""

    @property
    def pipelining(self) -> bool:
        return "pipelining" in self.extensions

    @property
    def broken(self) -> bool:
        """The server closed it, or a reply could not be read: never use it again."""
        return self._wire.failure is not None

    @property
    def unasked(self) -> bool:
        """Between transactions: the server sent something nobody asked for (an idle
        connection's ``421`` before it closes), which would be read as the next answer."""
        return self._wire.pending_bytes()

    def write(self, data: bytes) -> None:
        transport = self._wire.transport
        if transport is None or self.broken:
            raise self._wire.failure or Disconnected("not connected")
        transport.write(data)

    async def reply(self) -> Reply:
        async with asyncio.timeout(self.timeout):
            return await self._wire.next_reply()

    async def command(self, line: str) -> Reply:
        self.write(_line(line))
        return await self.reply()

    async def ehlo(self, name: str) -> None:
        """EHLO, and the extensions it names; HELO (none) to a server that knows no EHLO."""
        reply = await self.command(f"EHLO {name}")
        self.extensions = {}
        if 500 <= reply.code < 600:
            reply = await self.command(f"HELO {name}")
            if reply.code == 250:
                return
        if reply.code != 250:
            raise ReplyError("EHLO", reply)
        for entry in reply.text.decode("ascii", "replace").split("\n")[1:]:
            keyword, _, params = entry.partition(" ")
            self.extensions[keyword.lower()] = params

    async def starttls(self, context: ssl.SSLContext) -> None:
        if "starttls" not in self.extensions:
            raise SmtpError("STARTTLS extension not supported by server")
        reply = await self.command("STARTTLS")
        if reply.code != 220:
            raise ReplyError("STARTTLS", reply)
        if self._wire.pending_bytes():
            raise SmtpError("the server sent more after its 220 to STARTTLS, before TLS")
        transport = self._wire.transport
        assert transport is not None
        loop = asyncio.get_running_loop()
        secured = await loop.start_tls(
            transport,
            self._wire,
            context,
            server_hostname=self._host,
            ssl_handshake_timeout=self.timeout,
        )
        if secured is None:
            raise SmtpError("the connection closed during the TLS handshake")
        self._wire.transport = secured

    async def login(self, username: str, password: str) -> None:
        if "auth" not in self.extensions:
            raise SmtpError("SMTP AUTH extension not supported by server")
        methods = self.extensions["auth"].upper().split()
        if "PLAIN" in methods:
            token = base64.b64encode(f"\0{username}\0{password}".encode()).decode()
            reply = await self.command(f"AUTH PLAIN {token}")
        elif "LOGIN" in methods:
            reply = await self.command("AUTH LOGIN")
            for secret in (username, password):
                if reply.code != 334:
                    break
                reply = await self.command(base64.b64encode(secret.encode()).decode())
        else:
            raise SmtpError(f"no AUTH method notifier speaks (PLAIN, LOGIN) among {methods}")
        if reply.code != 235:
            raise AuthError("AUTH", reply)

    async def transaction(self, sender: str, recipient: str, content: bytes) -> Outcome:
        """One message to one recipient. ``content`` is the message with CRLF line ends."""
        self.messages += 1
        mail, rcpt = _line(f"MAIL FROM:<{sender}>"), _line(f"RCPT TO:<{recipient}>")
        data = b"DATA\r\n"
        self.step = "mail"
        if self.pipelining:
            self.write(mail + rcpt + data)
            reply = await self.reply()
            if reply.code != 250:
                return await self._rest_of_group(Outcome("mail", reply), 2)
            self.step = "rcpt"
            reply = await self.reply()
            if reply.code not in (250, 251):
                return await self._rest_of_group(Outcome("rcpt", reply), 1)
            self.step = "data"
            reply = await self.reply()
        else:
            self.write(mail)
            reply = await self.reply()
            if reply.code != 250:
                return Outcome("mail", reply)
            self.step = "rcpt"
            self.write(rcpt)
            reply = await self.reply()
            if reply.code not in (250, 251):
                return Outcome("rcpt", reply)
            self.step = "data"
            self.write(data)
            reply = await self.reply()
        if reply.code != 354:
            return Outcome("data", reply)
        self.write(_dot_stuffed(content))
        return Outcome("data", await self.reply())

    async def _rest_of_group(self, refused: Outcome, left: int) -> Outcome:
        """Read the answers still due to a pipelined group whose ``MAIL`` or ``RCPT`` was
        refused; a ``354`` to its ``DATA`` gets an empty message (RFC 2920 3.1). A connection
        whose answers cannot be read in order (or after a 421) is never used again."""
        if refused.reply.code == 421:  # the server is closing the channel
            self.abort()
            return refused
        try:
            for _ in range(left):
                last = await self.reply()
            if last.code == 354:
                await self.command(".")
        except (SmtpError, OSError, TimeoutError):
            self.abort()
        return refused

    async def rset(self) -> bool:
        """``RSET`` after a refused transaction: whether the connection can carry another."""
        return (await self.command("RSET")).code == 250

    async def noop(self) -> bool:
        return (await self.command("NOOP")).code == 250

    async def quit(self) -> None:
        """Say QUIT and wait (``timeout`` at most) for the server to close; never raises."""
        try:
            if not self.broken:
                await self.command("QUIT")
            async with asyncio.timeout(self.timeout):
                await asyncio.shield(self._wire.closed)
        except (SmtpError, OSError, TimeoutError):
            pass
        finally:
            self.abort()

    def abort(self) -> None:
        if self._wire.failure is None:
            self._wire.failure = Disconnected("closed by notifier")
        if self._wire.transport is not None:
            self._wire.transport.abort()

    async def wait_closed(self) -> None:
        await asyncio.shield(self._wire.closed)


async def connect(
    host: str,
    port: int,
    *,
    timeout: float,
    local_hostname: str,
    implicit_tls: ssl.SSLContext | None = None,
    starttls: ssl.SSLContext | None = None,
    login: tuple[str, str] | None = None,
) -> Connection:
    """A connection to ``host:port``, greeted, EHLO'd, secured and logged in as asked.

    A greeting other than 220 (``421 too many connections``) raises ``ReplyError`` with step
    ``greeting``; a refused or reset connection, ``OSError``.
    """
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout):
        _, wire = await loop.create_connection(
            _Wire,
            host,
            port,
            ssl=implicit_tls,
            server_hostname=host if implicit_tls is not None else None,
            ssl_handshake_timeout=timeout if implicit_tls is not None else None,
        )
    conn = Connection(wire, host, timeout)
    try:
        try:
            greeting = await conn.reply()
        except Disconnected as exc:
            raise ClosedAtGreeting(f"closed before its greeting ({exc})") from exc
        if greeting.code != 220:
            raise ReplyError("greeting", greeting)
        await conn.ehlo(local_hostname)
        if starttls is not None:
            await conn.starttls(starttls)
            await conn.ehlo(local_hostname)
        if login is not None:
            await conn.login(*login)
    except BaseException:
        conn.abort()
        raise
    return conn


def _line(command: str) -> bytes:
    """A command for the wire; a line break in it would be a second command, so none may be."""
    if "\r" in command or "\n" in command or not command.isascii():
        raise ValueError(f"SMTP command with a line break or non-ASCII text: {command[:100]!r}")
    return command.encode("ascii") + b"\r\n"


def _dot_stuffed(content: bytes) -> bytes:
    """The content as ``DATA`` sends it: CRLF line ends, a leading dot doubled, the final dot."""
    content = _LEADING_DOT.sub(b"..", _LINE_ENDS.sub(b"\r\n", content))
    if not content.endswith(b"\r\n"):
        content += b"\r\n"
    return content + b".\r\n"
