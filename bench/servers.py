"""Servers the benchmarks measure notifier against, each with what it counts.

``WebhookServer``: an HTTP/1.1 receiver on loopback, in a process of its own, that answers every
request 200 after a delay and counts requests and connections (the SMTP relay is
``bench/smtp_relay.py``). ``GrantRecorder``: a Redis ``MONITOR`` reader that keeps every
write the rate limiter's Lua script makes to one bucket, from which each grant is
reconstructed.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import re
import signal
import socket
import threading
from dataclasses import dataclass
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
