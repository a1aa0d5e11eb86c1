"""A bare socket server on loopback for the faults a real HTTP server will not commit.

Each accepted connection is handed to ``behave(conn, stopping)``: send garbage, say nothing,
answer some requests... ``accepted`` counts connections (proof that the fault happened) and a
behaviour may count ``requests``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

Behaviour = Callable[[socket.socket, threading.Event], None]


def read_request(conn: socket.socket) -> bytes | None:
    """One HTTP request with a Content-Length body, or None when the client hung up."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        body += conn.recv(65536)
    return head


def garbage(conn: socket.socket, _: threading.Event) -> None:
    """Read the request, answer with bytes that are not HTTP."""
    read_request(conn)
    conn.sendall(b"\x00\x01 this is not HTTP \xff\r\n\r\n")


def silence(conn: socket.socket, stopping: threading.Event) -> None:
    """Read the request and never answer (until the test ends)."""
    read_request(conn)
    stopping.wait(10)


class RawServer:
    """Accepts connections one at a time and hands each to ``behave(conn, stopping)``."""

    def __init__(self, behave: Behaviour) -> None:
        self.behave = behave
        self.accepted = 0
        self.requests = 0
        self.stopping = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            with conn:
                conn.settimeout(5)
                with contextlib.suppress(OSError):
                    self.behave(conn, self.stopping)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.listener.close()
