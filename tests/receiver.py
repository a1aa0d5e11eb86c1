"""A real HTTP webhook receiver on loopback that records each delivery and can be made slow.

Threaded, so slow requests do not queue behind each other like they would on a single-threaded
test server; HTTP/1.1 with keep-alive, like the receivers notifier meets in production, and with
a listen backlog deep enough for a worker's every concurrent send to connect at once.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512


@dataclass
class Receiver:
    #: seconds each request waits before it is answered
    delay: float = 0.0
    status: int = 200
    #: the address it listens on: loopback, or one that test hosts reach (``tests.testhosts``)
    host: str = "127.0.0.1"
    deliveries: list[tuple[str, float, float]] = field(default_factory=list)
    """(webhook-id, time the request arrived, time it was answered), monotonic."""
    requests: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    """Every request's headers and body, in the order they arrived."""
    connections: int = 0
    """TCP connections accepted: fewer than requests when the client keeps them alive."""
    answers: dict[str, tuple[int, dict[str, str], bytes]] = field(default_factory=dict)
    """By path: (status, headers, body) to answer instead of ``status`` with an empty body."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body in two writes: no delayed ACK

            def setup(self) -> None:
                super().setup()
                with receiver._lock:
                    receiver.connections += 1

            def do_POST(self) -> None:
                arrived = time.monotonic()
                length = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(length)
                json.loads(body)
                with receiver._lock:
                    receiver.requests.append(({**self.headers, "x-path": self.path}, body))
                time.sleep(receiver.delay)
                status, headers, answer = receiver.answers.get(
                    self.path, (receiver.status, {}, b"")
                )
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)
                with receiver._lock:
                    receiver.deliveries.append(
                        (self.headers["webhook-id"], arrived, time.monotonic())
                    )

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = _Server((self.host, 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://{self.host}:{self._server.server_address[1]}/hook"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def base(self) -> str:
        """``http://127.0.0.1:port``: add any path, answered as ``answers`` says."""
        return self.url.removesuffix("/hook")

    def paths(self) -> Counter[str]:
        """Requests received so far, by path."""
        with self._lock:
            return Counter(h.get("x-path", "") for h, _ in self.requests)

    def counts(self) -> Counter[str]:
        with self._lock:
            return Counter(d[0] for d in self.deliveries)

    def arrivals(self) -> Counter[str]:
        """webhook-id -> requests received, answered or not: a sender that never saw the
        answer (its network cut while it waited) has delivered all the same."""
        with self._lock:
            return Counter(
                next((v for k, v in headers.items() if k.lower() == "webhook-id"), "?")
                for headers, _ in self.requests
            )

    def arrived(self) -> int:
        """Requests received so far, answered or not."""
        with self._lock:
            return len(self.requests)

    def most_at_once(self) -> int:
        """The largest number of requests the receiver was handling at the same moment."""
        with self._lock:
            edges = sorted(
                [(arrived, 1) for _, arrived, _ in self.deliveries]
                + [(answered, -1) for _, _, answered in self.deliveries]
            )
        most = current = 0
        for _, step in edges:
            current += step
            most = max(most, current)
        return most
