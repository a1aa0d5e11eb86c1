"""Servers the benchmarks measure notifier against, each with what it counts.

``WebhookServer``: an HTTP/1.1 receiver on loopback, in a process of its own, that answers every
request 200 after a delay and counts requests and connections. ``SmtpRelay``: an ESMTP relay on
loopback, in a process of its own, that offers PIPELINING, answers each message after a delay,
refuses connections past a limit and keeps the ``Message-ID`` of every message it accepted.
``GrantRecorder``: a Redis ``MONITOR`` reader that keeps every write the rate limiter's Lua
script makes to one bucket, from which each grant is reconstructed.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import re
import signal
import socket
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import Connection as Pipe
from multiprocessing.process import BaseProcess
from multiprocessing.sharedctypes import Synchronized
from urllib.parse import urlsplit

from bench.common import SetupError, cpu_seconds

# --- a webhook receiver ------------------------------------------------------------------------


class _WebhookReceiver(asyncio.Protocol):  # pragma: no cover - runs in a child process
    """One keep-alive HTTP/1.1 connection: each request (its head, then ``Content-Length`` bytes
    of body) is answered ``200`` after ``delay`` s, in order; ``Connection: close`` is honoured.

    A protocol rather than asyncio streams, and a timer per request rather than a task: the
    receiver shares the machine's two cores with the worker it measures, so it is kept lean.
    """

    def __init__(
        self, delay: float, served: Synchronized[int], connections: Synchronized[int]
    ) -> None:
        self.delay = delay
        self.served = served
        self.connections = connections
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.connections.value += 1

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            length, close = _length_and_close(self.buffer[:end])
            if len(self.buffer) < end + 4 + length:
                return  # the body is still on its way
            self.buffer = self.buffer[end + 4 + length :]
            asyncio.get_running_loop().call_later(self.delay, self.answer, close)

    def answer(self, close: bool) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        self.served.value += 1
        if close:
            self.transport.close()


def _length_and_close(head: bytes) -> tuple[int, bool]:
    """A request head's ``Content-Length``, and whether it asks to close the connection."""
    length, close = 0, False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"connection" and value.strip().lower() == b"close":
            close = True
    return length, close


def _serve_webhooks(
    port: Pipe, served: Synchronized[int], connections: Synchronized[int], delay: float
) -> None:  # pragma: no cover - runs in a child process
    """An HTTP/1.1 server on loopback that answers every request 200 after ``delay`` s."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops it

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _WebhookReceiver(delay, served, connections), "127.0.0.1", 0, backlog=1024
        )
        port.send(server.sockets[0].getsockname()[1])
        port.close()
        async with server:
            await server.serve_forever()

    asyncio.run(main())


@dataclass
class WebhookServer:
    """A webhook receiver in a process of its own, so that it has its own GIL."""

    delay: float
    process: BaseProcess | None = None
    port: int = 0
    _served: Synchronized[int] | None = None
    _connections: Synchronized[int] | None = None

    def start(self) -> WebhookServer:
        ctx = multiprocessing.get_context("spawn")
        self._served = ctx.Value("q", 0, lock=False)
        self._connections = ctx.Value("q", 0, lock=False)
        ours, theirs = ctx.Pipe(duplex=False)
        self.process = ctx.Process(
            target=_serve_webhooks,
            args=(theirs, self._served, self._connections, self.delay),
            name="bench-webhook-server",
            daemon=True,
        )
        self.process.start()
        theirs.close()
        if not ours.poll(30):
            raise SetupError("the webhook server did not start within 30 s")
        self.port = int(ours.recv())
        ours.close()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    @property
    def served(self) -> int:
        return int(self._served.value) if self._served is not None else 0

    @property
    def connections(self) -> int:
        return int(self._connections.value) if self._connections is not None else 0

    @property
    def cpu_seconds(self) -> float:
        """CPU the receiver's process has used so far (it shares the cores with the worker)."""
        pid = self.process.pid if self.process is not None else None
        return (cpu_seconds(pid) or 0.0) if pid is not None else 0.0

    def stop(self) -> None:
        if self.process is not None and self.process.is_alive():
            self.process.terminate()
            self.process.join(5)
            if self.process.is_alive():
                self.process.kill()
                self.process.join()


# --- an SMTP relay ------------------------------------------------------------------------------

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


# --- the rate limiter's grants, read from Redis MONITOR ----------------------------------------

_HSET = re.compile(
    rb'^\+(\d+\.\d+) \[(\d+) lua\] "HSET" "([^"]+)" "tokens" "([^"]+)" "ts" "([^"]+)"'
)


class GrantRecorder(threading.Thread):
    """Every write of one rate-limit bucket, from ``MONITOR``: (server ms, tokens left).

    A raw socket, so the thread can stop at once. MONITOR shows the whole server's traffic;
    only the limiter's ``HSET`` on ``key`` in the benchmark's db is kept.
    """

    def __init__(self, redis_url: str, key: str) -> None:
        super().__init__(name="bench-grant-recorder", daemon=True)
        url = urlsplit(redis_url)
        self._address = (url.hostname or "127.0.0.1", url.port or 6379)
        self._db = (url.path.strip("/") or "0").encode()
        self._key = key.encode()
        self._halt = threading.Event()
        self._ready = threading.Event()
        self.writes: list[tuple[float, float]] = []
        self.error: str | None = None

    def start_and_wait(self) -> None:
        self.start()
        if not self._ready.wait(10):
            raise SetupError(f"Redis MONITOR did not start: {self.error}")

    def stop(self) -> None:
        self._halt.set()
        self.join(5)

    def run(self) -> None:
        try:
            with socket.create_connection(self._address, timeout=5) as sock:
                sock.sendall(b"MONITOR\r\n")
                sock.settimeout(0.2)
                buffer = b""
                while not self._halt.is_set():
                    try:
                        data = sock.recv(1 << 16)
                    except TimeoutError:
                        continue
                    if not data:
                        raise ConnectionError("Redis closed the MONITOR connection")
                    buffer += data
                    *lines, buffer = buffer.split(b"\r\n")
                    for line in lines:
                        if line == b"+OK":
                            self._ready.set()
                            continue
                        match = _HSET.match(line)
                        if match and match[2] == self._db and match[3] == self._key:
                            self.writes.append((float(match[5]), float(match[4])))
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    def grants(self, rate_per_ms: float, capacity: float) -> list[tuple[float, int]]:
        """(server time in s, tokens granted) of every acquire that granted some.

        Replays the bucket: before a write it held ``min(capacity, left + elapsed * rate)``
        (a bucket not written yet, or expired, is full); what the write left is the rest.
        """
        grants = []
        tokens, ts = float(capacity), None
        for now, left in self.writes:
            available = capacity if ts is None else min(capacity, tokens + (now - ts) * rate_per_ms)
            granted = round(available - left)
            if granted > 0:
                grants.append((now / 1000.0, granted))
            tokens, ts = left, now
        return grants
