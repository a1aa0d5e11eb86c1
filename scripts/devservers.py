"""Stand-ins for what notifier delivers to, for trying it out: a webhook receiver, a mail catcher
and a guard. Only the standard library, plus aiosmtpd for ``mail``.

    python scripts/devservers.py receiver [--port 8080]  answers 200 to a POST on any path, and
                                                        lists what came as JSON at GET /received
    python scripts/devservers.py mail [--port 8080] [--smtp-port 1025]
                                                        an SMTP server that keeps every email,
                                                        listed at GET /received on --port
    python scripts/devservers.py guard [--port 8081]    the built-in ``http`` guard's other side:
                                                        POST /confirm/USER marks a user confirmed;
                                                        a row whose payload names a confirmed
                                                        ``user`` is held back, any other is sent

``scripts/dev --webhooks --guard`` runs the receiver and the guard on 127.0.0.1; the trial stack
(deploy/trial/compose.yml) and the compose test run the receiver and the mail catcher in a
container. A POST to a path starting ``/slow`` is answered after half a second, so a test can
hold rows in flight. GET /health answers at once, for a container's health check. Everything
is kept in memory, at most ``KEEP`` entries, and lost on exit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

KEEP = 10_000
MAX_BODY = 1024 * 1024

received: deque[dict[str, Any]] = deque(maxlen=KEEP)
confirmed: set[str] = set()
lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    """GET /received for every server; POSTs as the server's ``role`` says."""

    role = "receiver"

    def do_GET(self) -> None:
        # The lists are copied under the lock and written outside it: a reader that stops
        # reading a long list must not hold up the POSTs (they would time out and be sent again).
        if self.path == "/health":
            self._json(200, {"ok": True})
        elif self.path == "/received":
            with lock:
                entries = list(received)
            self._json(200, entries)
        elif self.path == "/confirmed" and self.role == "guard":
            with lock:
                users = sorted(confirmed)
            self._json(200, users)
        else:
            self._json(404, {"error": f"no page {self.path!r}: try GET /received"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or "0")
        if not 0 <= length <= MAX_BODY:
            self._json(413, {"error": f"a body of at most {MAX_BODY} bytes"})
            return
        data = self.rfile.read(length)
        if self.role == "guard":
            self._guard(data)
            return
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
        self._json(200, {})

    def _guard(self, data: bytes) -> None:
        if self.path.startswith("/confirm/"):
            user = unquote(self.path.removeprefix("/confirm/"))[:200]
            with lock:
                confirmed.add(user)
            self._json(200, {"confirmed": user})
            return
        # The guard protocol (notifier/delivery/guards.py, HttpGuard): the row as JSON in, and
        # {"send": true} or {"send": false, "reason": ...} out.
        try:
            row = json.loads(data)
            payload = row.get("payload") or {}
            user = payload.get("user") if isinstance(payload, dict) else None
        except (ValueError, AttributeError):
            self._json(400, {"error": "the body must be the guard's JSON object"})
            return
        with lock:
            held = user is not None and str(user) in confirmed
        answer = {"send": False, "reason": f"user {user} confirmed"} if held else {"send": True}
        with lock:
            received.append({"path": self.path, "row": row, "answer": answer})
        self._json(200, answer)

    def _json(self, status: int, document: object) -> None:
        body = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Catcher:
    """aiosmtpd's handler: keep each email."""

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
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("role", choices=["receiver", "webhook", "mail", "smtp", "guard"])
    parser.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1")
    parser.add_argument("--port", type=int, help="HTTP port: 8080, the guard's 8081")
    parser.add_argument("--smtp-port", type=int, default=1025, help="mail's SMTP port (1025)")
    args = parser.parse_args()
    role = {"webhook": "receiver", "smtp": "mail"}.get(args.role, args.role)
    if role == "mail":
        from aiosmtpd.controller import Controller

        Controller(Catcher(), hostname=args.host, port=args.smtp_port).start()
    port = args.port or (8081 if role == "guard" else 8080)
    server = ThreadingHTTPServer((args.host, port), type("Server", (Handler,), {"role": role}))
    server.daemon_threads = True
    server.request_queue_size = 1024
    print(f"{role} listening on http://{args.host}:{port}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()


if __name__ == "__main__":
    main()
