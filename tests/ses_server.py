"""Amazon SES on loopback for the ``ses`` provider's tests: moto in server mode, a real
implementation of the SES v2 API (``ThreadedMotoServer`` on a free port), and a proxy in front of
it that keeps each request as it went on the wire (moto drops message tags and configuration
sets) and counts its connections.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import boto3
import httpx
from moto.server import ThreadedMotoServer

SEND_PATH = "/v2/email/outbound-emails"


@contextmanager
def moto_ses() -> Iterator[str]:
    """moto's SES on a free loopback port of its own; its base URL."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def reset(moto: str) -> None:
    """Forget every identity and message."""
    httpx.post(moto + "/moto-api/reset").raise_for_status()


def stored(moto: str) -> list[dict[str, Any]]:
    """The raw messages moto's SES accepted: ``id``, ``source``, ``destinations``, ``raw_data``."""
    return list(httpx.get(moto + "/moto-api/data.json").json()["ses"]["RawMessage"])


def verify(moto: str, identity: str, region: str) -> None:
    """Make ``identity`` (an address or a domain) a verified one in moto's SES."""
    client = boto3.client(
        "sesv2",
        endpoint_url=moto,
        region_name=region,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    client.create_email_identity(EmailIdentity=identity)


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Recorder:
    """What the proxy saw: every request, and how many connections carried them."""

    url: str
    requests: list[Recorded] = field(default_factory=list)
    connections: int = 0

    def sends(self) -> list[dict[str, Any]]:
        """The ``SendEmail`` requests' JSON bodies."""
        return [json.loads(r.body) for r in self.requests if r.path == SEND_PATH]


class _Proxy(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so that connection reuse shows
    recorder: Recorder
    upstream: str

    def setup(self) -> None:
        super().setup()
        self.recorder.connections += 1

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.recorder.requests.append(Recorded(self.path, headers, body))
        upstream = urlsplit(self.upstream)
        conn = http.client.HTTPConnection(upstream.hostname or "", upstream.port, timeout=30)
        try:
            conn.request("POST", self.path, body, dict(self.headers.items()))
            answer = conn.getresponse()
            data = answer.read()
        finally:
            conn.close()
        self.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in ("content-length", "connection", "transfer-encoding", "date"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def recording(upstream: str) -> Iterator[Recorder]:
    """A proxy on a free loopback port that forwards to ``upstream`` and records."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Proxy)
    found = Recorder(f"http://127.0.0.1:{server.server_address[1]}")
    server.RequestHandlerClass = type("Proxy", (_Proxy,), {"recorder": found, "upstream": upstream})
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield found
    finally:
        server.shutdown()
        server.server_close()
