"""``notifier events`` as a real process on loopback, with the secrets and servers its tests
sign with: an SNS signing certificate served over HTTP (fetches counted, optionally slowed),
a SendGrid ECDSA key, and each provider's shared secret; and what signs requests with them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import redis
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from tests.certificates import self_signed

REPO = Path(__file__).resolve().parents[1]
COMMAND = (sys.executable, "-m", "notifier.cli", "events", "--host", "127.0.0.1")
TOPIC = "arn:aws:sns:us-east-1:123456789012:ses-feedback"
MAILGUN_KEY = "key-mailgun-test-signing"
POSTMARK_AUTH = "postmark:s3cret"
TWILIO_TOKEN = "twilio-auth-token-test"
PUBLIC = "https://events.example.test"
SECRET = "unsubscribe-secret-test"
#: The preference center the endpoint serves: its categories and their channels.
CENTER = "marketing=email,sms;digest=email;security=email"
#: JSON nested 10,000 deep: deeper than any parser's recursion.
DEEP = b"[" * 10_000 + b"]" * 10_000


class CertServer(ThreadingHTTPServer):
    """Serves the SNS signing certificate at ``/cert.pem`` (counting each fetch in
    ``fetches``, each after ``delay`` seconds) and counts subscription confirmations."""

    pem: bytes = b""
    confirmed: list[str]
    fetches: list[str]
    delay: float = 0.0


class _Handler(BaseHTTPRequestHandler):
    server: CertServer

    def do_GET(self) -> None:
        status = 200
        if self.path.endswith(".pem"):
            self.server.fetches.append(self.path)
            time.sleep(self.server.delay)
            body = self.server.pem
            if self.path != "/cert.pem":
                status, body = 404, b"no such certificate"
        else:
            self.server.confirmed.append(self.path)
            body = b"<ConfirmSubscriptionResponse/>"
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class Endpoint:
    url: str
    sns_key: rsa.RSAPrivateKey
    cert_base: str
    certs: CertServer
    sendgrid_key: ec.EllipticCurvePrivateKey
    proc: subprocess.Popen[bytes]
    log: Path
    port: int
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30))

    def post(self, path: str, body: bytes, **headers: str | bytes) -> httpx.Response:
        return self.client.post(self.url + path, content=body, headers=headers)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _self_signed(key: rsa.RSAPrivateKey) -> bytes:
    return self_signed(key, "sns.amazonaws.com")


@contextmanager
def running_endpoint(database_url: str, redis_url: str, tmp_path: Path) -> Iterator[Endpoint]:
    """``notifier events`` on a free port, answering ``/health``; stopped afterwards."""
    sns_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    certs = CertServer(("127.0.0.1", 0), _Handler)
    certs.pem, certs.confirmed, certs.fetches = _self_signed(sns_key), [], []
    threading.Thread(target=certs.serve_forever, daemon=True).start()
    cert_base = f"http://127.0.0.1:{certs.server_address[1]}"
    sendgrid_key = ec.generate_private_key(ec.SECP256R1())
    public_der = sendgrid_key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    port = _free_port()
    env = {
        **os.environ,
        "NOTIFIER_DATABASE_URL": database_url,
        "NOTIFIER_REDIS_URL": redis_url,
        "NOTIFIER_SNS_TOPIC_ARNS": TOPIC,
        "NOTIFIER_SNS_CERT_URL_PATTERN": f"^{cert_base.replace('.', '[.]')}/",
        "NOTIFIER_SENDGRID_PUBLIC_KEY": base64.b64encode(public_der).decode(),
        "NOTIFIER_MAILGUN_SIGNING_KEY": MAILGUN_KEY,
        "NOTIFIER_POSTMARK_WEBHOOK_AUTH": POSTMARK_AUTH,
        "NOTIFIER_TWILIO_AUTH_TOKEN": TWILIO_TOKEN,
        "NOTIFIER_EVENTS_PUBLIC_URL": PUBLIC,
        "NOTIFIER_UNSUBSCRIBE_SECRET": SECRET,
        "NOTIFIER_SOFT_BOUNCE_LIMIT": "3",
        "NOTIFIER_PREFERENCE_CENTER": CENTER,
        "NOTIFIER_PREFERENCE_DEFAULTS": "digest=off",
    }
    log = tmp_path / "events.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*COMMAND, "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    ep = Endpoint(url, sns_key, cert_base, certs, sendgrid_key, proc, log, port)
    deadline = time.monotonic() + 60
    try:
        while True:  # until it answers, or has exited (then its log says why)
            assert proc.poll() is None, log.read_text()
            try:
                if ep.client.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield ep
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        ep.client.close()
        certs.shutdown()
        certs.server_close()


def redis_keys(redis_url: str) -> list[bytes]:
    """Every key but the endpoint's refusal counter: what a refused request must not write."""
    client = redis.Redis.from_url(redis_url)
    try:
        return sorted(k for k in client.keys("*") if k != b"notifier:metrics:events")
    finally:
        client.close()


def signed_sendgrid(ep: Endpoint, body: bytes, stamp: str | None = None) -> dict[str, bytes]:
    """SendGrid's headers for ``body``; the timestamp as UTF-8, whatever characters it has."""
    ts = (stamp if stamp is not None else str(int(time.time()))).encode()
    signature = ep.sendgrid_key.sign(ts + body, ec.ECDSA(hashes.SHA256()))
    return {
        "X-Twilio-Email-Event-Webhook-Signature": base64.b64encode(signature),
        "X-Twilio-Email-Event-Webhook-Timestamp": ts,
    }


def mailgun_signature(token: str, stamp: str | None = None) -> dict[str, str]:
    ts = stamp if stamp is not None else str(int(time.time()))
    mac = hmac.new(MAILGUN_KEY.encode(), (ts + token).encode(), hashlib.sha256).hexdigest()
    return {"timestamp": ts, "token": token, "signature": mac}


def postmark_auth() -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(POSTMARK_AUTH.encode()).decode()}
