"""An SMTP relay on loopback for the SMTP client's tests: what it offers and how it answers are
set per test, and it records what each connection sent and when, relative to its answers.

``sessions`` holds, per admitted connection, every command as ``(verb, answers sent before it
arrived)``: commands of a pipelined group arrive before any answer to the first of them. With
``hold_envelope`` (and PIPELINING offered) the answers to ``MAIL`` and ``RCPT`` are held back
until ``DATA`` arrives, as RFC 2920 lets a server do: a client that waited for each answer
would wait for ever, so a message getting through proves the group was pipelined.

``delay`` holds each message's answer back that long. ``limit`` refuses connections past that
many open at once (``421`` at the greeting, then closed) and counts them; ``mail_reply``
replaces the answer to ``MAIL`` (a ``421`` closes the connection after it); ``hang_at`` names a
verb whose answer starts and never ends.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field


@dataclass
class SmtpRelay:
    pipelining: bool = True
    #: answer EHLO 502, as a server that only speaks RFC 821 SMTP (HELO) does
    ehlo: bool = True
    hold_envelope: bool = False
    limit: int | None = None
    mail_reply: str = "250 OK"
    hang_at: str | None = None
    #: seconds before a message's content is answered (on this connection, nothing else is
    #: answered meanwhile)
    delay: float = 0.0
    host: str = "127.0.0.1"
    port: int = 0
    sessions: list[list[tuple[str, int]]] = field(default_factory=list)
    messages: list[bytes] = field(default_factory=list)
    refused: int = 0
    peak: int = 0
    open: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _server: asyncio.Server | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _live: set[_Session] = field(default_factory=set)

    def start(self) -> SmtpRelay:
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, daemon=True)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(self._listen(), loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _listen(self) -> asyncio.Server:
        loop = asyncio.get_running_loop()
        return await loop.create_server(lambda: _Session(self), self.host, self.port)

    def stop(self) -> None:
        loop, server = self._loop, self._server
        if loop is None or server is None:
            return

        async def close() -> None:
            server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
            for session in list(self._live):
                if session.transport is not None:
                    session.transport.close()

        asyncio.run_coroutine_threadsafe(close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        assert self._thread is not None
        self._thread.join(10)
        loop.close()
        self._loop = None

    @property
    def connections(self) -> int:
        """Connections admitted (past the greeting) so far."""
        with self._lock:
            return len(self.sessions)

    def verbs(self, session: int) -> list[str]:
        with self._lock:
            return [verb for verb, _ in self.sessions[session]]


class _Session(asyncio.Protocol):
    def __init__(self, relay: SmtpRelay) -> None:
        self.relay = relay
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.in_data = False
        self.answered = 0
        self.held: list[bytes] = []
        self.log: list[tuple[str, int]] = []
        self.admitted = False
        self.hung = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        relay = self.relay
        with relay._lock:
            if relay.limit is not None and relay.open >= relay.limit:
                relay.refused += 1
                transport.write(b"421 4.7.0 too many connections\r\n")
                transport.close()
                return
            self.admitted = True
            relay.open += 1
            relay.peak = max(relay.peak, relay.open)
            relay.sessions.append(self.log)
            relay._live.add(self)
        self.send(b"220 test relay ESMTP")

    def connection_lost(self, exc: Exception | None) -> None:
        if self.admitted:
            with self.relay._lock:
                self.relay.open -= 1
                self.relay._live.discard(self)

    def send(self, reply: bytes) -> None:
        assert self.transport is not None
        self.answered += 1
        self.transport.write(reply + b"\r\n")

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self.transport is not None and not self.transport.is_closing():
            if self.in_data:
                end = self.buffer.find(b"\r\n.\r\n")
                if end < 0:
                    return
                with self.relay._lock:
                    self.relay.messages.append(self.buffer[: end + 2])
                self.buffer = self.buffer[end + 5 :]
                self.in_data = False
                if self.relay.delay:
                    asyncio.get_running_loop().call_later(
                        self.relay.delay, self.send, b"250 2.0.0 accepted"
                    )
                    return  # the next command of a pipelining client waits for this answer
                self.send(b"250 2.0.0 accepted")
                continue
            end = self.buffer.find(b"\r\n")
            if end < 0:
                return
            line, self.buffer = self.buffer[:end], self.buffer[end + 2 :]
            self.command(line)

    def command(self, line: bytes) -> None:
        verb = line[:4].decode().upper()
        with self.relay._lock:
            self.log.append((verb, self.answered))
        relay = self.relay
        if self.hung:
            return
        if verb == relay.hang_at:
            assert self.transport is not None
            self.transport.write(b"250-still thinking\r\n")  # and never the last line
            self.hung = True
            return
        if verb == "EHLO" and not relay.ehlo:
            self.send(b"502 5.5.2 command not recognized")
        elif verb == "EHLO":
            offered = ["test.relay", "PIPELINING", "8BITMIME"]
            if not relay.pipelining:
                offered.remove("PIPELINING")
            lines = [f"250-{x}" for x in offered[:-1]] + [f"250 {offered[-1]}"]
            self.send("\r\n".join(lines).encode())
        elif verb == "MAIL":
            self.reply_to_envelope(relay.mail_reply.encode())
            if relay.mail_reply.startswith("421") and self.transport is not None:
                self.transport.close()
        elif verb == "RCPT":
            self.reply_to_envelope(b"250 OK")
        elif verb == "DATA":
            for held in self.held:
                self.send(held)
            self.held = []
            self.in_data = True
            self.send(b"354 go ahead")
        elif verb == "QUIT":
            self.send(b"221 bye")
            assert self.transport is not None
            self.transport.close()
        else:
            self.send(b"250 OK")

    def reply_to_envelope(self, reply: bytes) -> None:
        if self.relay.hold_envelope and self.relay.pipelining:
            self.held.append(reply)
        else:
            self.send(reply)
