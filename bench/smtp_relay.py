"""An SMTP relay on loopback for the email benchmark, in a process of its own: it offers
PIPELINING, answers each message's final dot after a delay, refuses connections past a limit
with 421, and keeps the row id of every message it accepted."""

from __future__ import annotations

import asyncio
import multiprocessing
import re
import signal
from dataclasses import dataclass, field
from multiprocessing.connection import Connection as Pipe
from multiprocessing.process import BaseProcess

from bench.common import SetupError, cpu_seconds

_MESSAGE_ID = re.compile(rb"^Message-ID: <notification-(\d+)@", re.MULTILINE | re.IGNORECASE)
_EHLO = b"250-bench.relay\r\n250-PIPELINING\r\n250-8BITMIME\r\n250 SIZE 10485760\r\n"


@dataclass
class RelayCounts:
    """What the relay saw: row ids of the messages it accepted (one per message, in order),
    connections accepted and refused, and the most open at once."""

    row_ids: list[int]
    connections: int
    refused: int
    peak: int


class _RelaySession(asyncio.Protocol):  # pragma: no cover - runs in a child process
    """One SMTP connection. Commands are answered in order (a pipelined group included); the
    answer to a message's final dot comes ``delay`` s after it arrived, and any answer queued
    behind it waits for it. Enough SMTP for notifier's client, nothing more."""

    def __init__(self, relay: _RelayState) -> None:
        self.relay = relay
        self.buffer = b""
        self.in_data = False
        self.pending: list[tuple[float, bytes, bool]] = []  # (when, reply, close after it)
        self.transport: asyncio.Transport | None = None
        self.admitted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        relay = self.relay
        if relay.open >= relay.limit:
            relay.refused += 1
            transport.write(b"421 4.7.0 too many connections, try again later\r\n")
            transport.close()
            return
        self.admitted = True
        relay.open += 1
        relay.connections += 1
        relay.peak = max(relay.peak, relay.open)
        transport.write(b"220 bench.relay ESMTP\r\n")

    def connection_lost(self, exc: Exception | None) -> None:
        if self.admitted:
            self.relay.open -= 1

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            if self.in_data:
                end = self.buffer.find(b"\r\n.\r\n")
                if end < 0:
                    return
                content, self.buffer = self.buffer[: end + 2], self.buffer[end + 5 :]
                self.in_data = False
                found = _MESSAGE_ID.search(content)
                self.relay.row_ids.append(int(found[1]) if found else -1)
                self.answer(b"250 2.0.0 queued\r\n", self.relay.delay)
                continue
            end = self.buffer.find(b"\r\n")
            if end < 0:
                return
            line, self.buffer = self.buffer[:end], self.buffer[end + 2 :]
            verb = line[:4].upper()
            if verb == b"EHLO":
                self.answer(_EHLO)
            elif verb == b"DATA":
                self.in_data = True
                self.answer(b"354 go ahead\r\n")
            elif verb == b"QUIT":
                self.answer(b"221 bye\r\n", close=True)
            else:  # MAIL, RCPT, RSET, NOOP, HELO
                self.answer(b"250 OK\r\n")

    def answer(self, reply: bytes, delay: float = 0.0, *, close: bool = False) -> None:
        loop = asyncio.get_running_loop()
        self.pending.append((loop.time() + delay, reply, close))
        if len(self.pending) == 1:
            self.flush()

    def flush(self) -> None:
        loop = asyncio.get_running_loop()
        transport = self.transport
        while self.pending and transport is not None and not transport.is_closing():
            at, reply, close = self.pending[0]
            if at > loop.time():
                loop.call_at(at, self.flush)
                return
            self.pending.pop(0)
            transport.write(reply)
            if close:
                transport.close()


@dataclass
class _RelayState:  # pragma: no cover - lives in the child process
    delay: float
    limit: int
    open: int = 0
    connections: int = 0
    refused: int = 0
    peak: int = 0
    row_ids: list[int] = field(default_factory=list)


def _serve_smtp(pipe: Pipe, delay: float, limit: int) -> None:  # pragma: no cover - a child
    """Serve until the parent sends anything on ``pipe``; then send it the ``RelayCounts``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops it
    state = _RelayState(delay, limit)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _RelaySession(state), "127.0.0.1", 0, backlog=1024
        )
        pipe.send(server.sockets[0].getsockname()[1])
        stop = asyncio.Event()
        loop.add_reader(pipe.fileno(), stop.set)
        async with server:
            await stop.wait()
        loop.remove_reader(pipe.fileno())

    asyncio.run(main())
    pipe.recv()
    pipe.send(RelayCounts(state.row_ids, state.connections, state.refused, state.peak))
    pipe.close()


@dataclass
class SmtpRelay:
    """An SMTP relay in a process of its own (its own GIL): ``delay`` s per message, at most
    ``limit`` connections open at once (those past it are answered 421 and closed)."""

    delay: float
    limit: int
    process: BaseProcess | None = None
    port: int = 0
    _pipe: Pipe | None = None

    def start(self) -> SmtpRelay:
        ctx = multiprocessing.get_context("spawn")
        ours, theirs = ctx.Pipe(duplex=True)
        self.process = ctx.Process(
            target=_serve_smtp,
            args=(theirs, self.delay, self.limit),
            name="bench-smtp-relay",
            daemon=True,
        )
        self.process.start()
        theirs.close()
        if not ours.poll(30):
            raise SetupError("the SMTP relay did not start within 30 s")
        self.port = int(ours.recv())
        self._pipe = ours
        return self

    @property
    def cpu_seconds(self) -> float:
        pid = self.process.pid if self.process is not None else None
        return (cpu_seconds(pid) or 0.0) if pid is not None else 0.0

    def stop(self) -> RelayCounts | None:
        """Stop the relay; what it saw, or None if it could not tell."""
        counts = None
        if self._pipe is not None and self.process is not None and self.process.is_alive():
            self._pipe.send("stop")
            if self._pipe.poll(30):
                counts = self._pipe.recv()
            self._pipe.close()
            self._pipe = None
        if self.process is not None:
            self.process.join(5)
            if self.process.is_alive():
                self.process.kill()
                self.process.join()
        return counts
