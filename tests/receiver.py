"""A real HTTP webhook receiver on loopback that records each delivery and can be made slow.

Threaded, so slow requests do not queue behind each other like they would on a single-threaded
test server.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Receiver:
    #: seconds each request waits before it is answered
    delay: float = 0.0
    status: int = 200
    deliveries: list[tuple[str, float, float]] = field(default_factory=list)
    """(webhook-id, time the request arrived, time it was answered), monotonic."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                arrived = time.monotonic()
                length = int(self.headers.get("Content-Length", 0))
                json.loads(self.rfile.read(length))
                time.sleep(receiver.delay)
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()
                with receiver._lock:
                    receiver.deliveries.append(
                        (self.headers["webhook-id"], arrived, time.monotonic())
                    )

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def counts(self) -> Counter[str]:
        with self._lock:
            return Counter(d[0] for d in self.deliveries)
