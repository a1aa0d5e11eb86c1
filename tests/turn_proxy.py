"""A TCP proxy in front of PostgreSQL that counts round trips as they happen on the wire.

A round trip is a turn of the conversation: the client sends, then waits for the server's
answer. On each connection the proxy counts the times the client starts sending after it has
asked for an answer (a ``Sync``, a ``Flush``, a simple ``Query``, the start-up or a password
message) and the server has spoken since, or first. So a statement sent on its own is one, and
statements sent together in one flight (a pipeline, or several in one simple query) are one as
well, even when the server answers the flight's first statements before its last ones arrive
(as it does when the client is slow to write them: it has not waited for that answer). A
``BEGIN``, a ``COMMIT``, a ping or a ``SET`` sent on its own each count, as they each cost a
wait for the server: what a network hop between a worker and its database multiplies.

Bytes are relayed unchanged; TLS is not spoken (the tests' URLs say ``sslmode=disable``).
"""

from __future__ import annotations

import selectors
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

from sqlalchemy.engine import make_url


@dataclass
class Turns:
    """What the proxy saw: round trips over every connection since the last ``reset``."""

    trips: int = 0
    connections: int = 0
    #: the first bytes each round trip sent (its statement's text, mostly), to say which they were
    starts: list[bytes] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        with self._lock:
            self.trips = 0
            self.starts = []

    def said(self) -> list[str]:
        """What each round trip since the last ``reset`` began with, as readable text."""
        with self._lock:
            return [_readable(start) for start in self.starts]

    def count(self) -> int:
        with self._lock:
            return self.trips

    def _trip(self, data: bytes) -> None:
        with self._lock:
            self.trips += 1
            if len(self.starts) < 10_000:
                self.starts.append(data[:200])


def _readable(data: bytes) -> str:
    """The printable runs of a protocol message, e.g. ``P BEGIN B E S``."""
    text = "".join(chr(b) if 32 <= b < 127 else " " for b in data)
    return " ".join(text.split())[:120]


#: The client's messages after which it waits for the server: the start-up (which has no type
#: byte, 0 here), ``Sync``, ``Flush``, a simple ``Query``, a password or SASL answer.
_ASKING = frozenset({0, *b"SHQp"})


class _ClientMessages:
    """The types of the messages in a client's byte stream, read across ``recv`` chunks: a
    message is its type byte and a length that counts itself but not the type (the first
    message, the start-up, has no type byte)."""

    def __init__(self) -> None:
        self.started = False
        self.head = b""  # the part of a message's header read so far
        self.skip = 0  # the bytes of the current message's body still to come

    def types(self, data: bytes) -> list[int]:
        found: list[int] = []
        i = 0
        while i < len(data):
            if self.skip:
                step = min(self.skip, len(data) - i)
                self.skip -= step
                i += step
                continue
            header = 5 if self.started else 4
            take = data[i : i + header - len(self.head)]
            self.head += take
            i += len(take)
            if len(self.head) < header:
                break
            kind = self.head[0] if self.started else 0
            self.skip = int.from_bytes(self.head[header - 4 :], "big") - 4
            self.started, self.head = True, b""
            found.append(kind)
        return found


class _Pair:
    """One client connection and its connection to the server."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client, self.server = client, server
        self.messages = _ClientMessages()
        self.first = True  # nothing sent yet
        self.asked = False  # the client has asked for an answer since its turn began
        self.answered = False  # and the server has spoken since it asked


@contextmanager
def counting(url: str) -> Iterator[tuple[str, Turns]]:
    """A proxy to the PostgreSQL of ``url``; yields the URL through it and its counts."""
    target = make_url(url)
    upstream = (target.host or "127.0.0.1", target.port or 5432)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    turns = Turns()
    stop = threading.Event()
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, None)
    pairs: list[_Pair] = []

    def close(pair: _Pair) -> None:
        for s in (pair.client, pair.server):
            with suppress(KeyError, ValueError):
                selector.unregister(s)
            s.close()
        if pair in pairs:
            pairs.remove(pair)

    def relay(pair: _Pair, source: socket.socket) -> None:
        try:
            data = source.recv(65536)
        except OSError:
            data = b""
        if not data:
            close(pair)
            return
        if source is pair.client:
            if pair.first or (pair.asked and pair.answered):
                turns._trip(data)
                pair.first = pair.asked = pair.answered = False
            if not _ASKING.isdisjoint(pair.messages.types(data)):
                pair.asked = True
        elif pair.asked:
            pair.answered = True
        (pair.server if source is pair.client else pair.client).sendall(data)

    def loop() -> None:
        while not stop.is_set():
            for key, _ in selector.select(timeout=0.1):
                if key.data is None:
                    client, _address = listener.accept()
                    server = socket.create_connection(upstream, timeout=10)
                    for s in (client, server):
                        s.setblocking(True)
                        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    pair = _Pair(client, server)
                    pairs.append(pair)
                    turns.connections += 1
                    selector.register(client, selectors.EVENT_READ, (pair, client))
                    selector.register(server, selectors.EVENT_READ, (pair, server))
                else:
                    pair, source = key.data
                    relay(pair, source)

    thread = threading.Thread(target=loop, daemon=True, name="turn-proxy")
    thread.start()
    through = target.set(host="127.0.0.1", port=port)
    query = dict(through.query)
    query["sslmode"] = "disable"
    try:
        yield through.set(query=query).render_as_string(hide_password=False), turns
    finally:
        stop.set()
        thread.join(timeout=10)
        for pair in list(pairs):
            close(pair)
        selector.close()
        listener.close()
