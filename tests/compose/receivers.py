"""What the compose test's notifier containers deliver to: ``smtp`` or ``webhook``.

``smtp``: a mail catcher, SMTP on port 1025. ``webhook``: POSTs to any path on port 8080 are
answered 200 (``/slow`` after half a second, so a worker holds rows in flight). Both keep what
arrived in memory and list it as JSON at ``GET /received`` on port 8080 (the webhook receiver
serves its API beside the hooks; the mail catcher on the same port).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

received: list[dict[str, Any]] = []
lock = threading.Lock()


class Api(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        with lock:
            body = json.dumps(received).encode()
        self._answer(200 if self.path == "/received" else 404, body)

    def do_POST(self) -> None:
        data = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path.startswith("/slow"):
            time.sleep(0.5)
        entry = {
            "path": self.path,
            "id": self.headers.get("webhook-id"),
            "timestamp": self.headers.get("webhook-timestamp"),
            "signature": self.headers.get("webhook-signature"),
            "body": data.decode(errors="replace"),
        }
        with lock:
            received.append(entry)
        self._answer(200, b"{}")

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Catcher:
    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        with lock:
            received.append(
                {
                    "mail_from": envelope.mail_from,
                    "rcpt_tos": list(envelope.rcpt_tos),
                    "data": envelope.content.decode(errors="replace"),
                }
            )
        return "250 OK"


def main() -> None:
    if sys.argv[1:] == ["smtp"]:
        from aiosmtpd.controller import Controller

        Controller(Catcher(), hostname="0.0.0.0", port=1025).start()
    elif sys.argv[1:] != ["webhook"]:
        sys.exit("usage: receivers.py smtp|webhook")
    server = ThreadingHTTPServer(("0.0.0.0", 8080), Api)
    server.daemon_threads = True
    server.request_queue_size = 1024
    server.serve_forever()


if __name__ == "__main__":
    main()
