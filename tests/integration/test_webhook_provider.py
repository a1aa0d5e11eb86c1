"""The webhook provider against real HTTP servers on loopback.

pytest-httpserver answers the well-formed cases; ``RawServer`` (a bare socket in a thread) plays
the receivers HTTP libraries refuse to imitate: garbage replies, silence, keep-alive counting.

Every server here is on loopback, which notifier refuses to call unless the operator allows it,
so ``make_provider`` allows loopback by default (``LOOPBACK``); the SSRF tests at the end allow
nothing and prove that no connection reached a listening socket.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any
from uuid import uuid4

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Response

from notifier.models import Notification
from notifier.providers.base import InvalidNotification, Permanent, Retry, Sent
from notifier.providers.webhook import WebhookProvider
from notifier.settings import get_settings
from tests.factories import SetEnv
from tests.raw_server import Behaviour, RawServer, garbage, read_request, silence

# Both loopbacks: "localhost" resolves to ::1 as well as 127.0.0.1 on many machines.
LOOPBACK = "127.0.0.0/8,::1/128"
SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()

MakeProvider = Callable[..., WebhookProvider]


def notification(recipient: str, id: int = 42, **fields: Any) -> Notification:
    values: dict[str, Any] = {
        "subject": "Your order shipped",
        "body": "It left the warehouse.",
        "payload": {"order": 7},
    }
    values.update(fields)
    return Notification(
        id=id,
        channel="webhook",
        recipient=recipient,
        attempts=1,
        max_attempts=5,
        claim_token=uuid4(),
        created_at=datetime.now(UTC),
        **values,
    )


@pytest.fixture
def make_provider(set_env: SetEnv) -> Iterator[MakeProvider]:
    """Builds providers from the environment, the way the registry does; shuts them down after."""
    made: list[WebhookProvider] = []

    def make(
        *,
        secret: str | None = SECRET,
        timeout: float = 5,
        allow_http: bool = True,
        allowed: str = LOOPBACK,
    ) -> WebhookProvider:
        set_env(
            webhook_allow_http=allow_http,
            webhook_allowed_networks=allowed,
            webhook_timeout=timeout,
            webhook_secret=secret,
        )
        made.append(WebhookProvider(get_settings()))
        return made[-1]

    yield make
    for provider in made:
        provider.shutdown()


# -- a bare TCP server ---------------------------------------------------------------------------


# -- what the receiver answers -> what the provider says -----------------------------------------


def _in_two_minutes() -> str:
    return format_datetime(datetime.now(UTC) + timedelta(seconds=120), usegmt=True)


RESPONSES = [
    # status, headers (or a function making them), body, outcome type, error fragment, retry_after
    (200, {}, "ok", Sent, None, None),
    (204, {}, "", Sent, None, None),
    (400, {}, "missing field order", Permanent, "HTTP 400 from localhost:", None),
    (404, {}, "no such hook", Permanent, ": no such hook", None),
    (410, {}, "hook deleted", Permanent, "HTTP 410", None),
    (408, {}, "slow", Retry, "HTTP 408", None),
    (429, {"Retry-After": "7"}, "slow down", Retry, "HTTP 429", 7.0),
    (429, lambda: {"Retry-After": _in_two_minutes()}, "", Retry, "HTTP 429", 120.0),
    (500, {}, "boom " * 30_000, Retry, "HTTP 500 from localhost:", None),
    (503, {"Retry-After": "soon"}, "maintenance", Retry, ": maintenance", None),
    (301, {"Location": "https://new.example/hook"}, "", Permanent, "to https://new.example", None),
]


@pytest.mark.parametrize(
    ("status", "headers", "body", "kind", "fragment", "retry_after"),
    RESPONSES,
    ids=[f"{r[0]}-{i}" for i, r in enumerate(RESPONSES)],
)
def test_outcome_follows_the_response(
    make_provider: MakeProvider,
    httpserver: HTTPServer,
    status: int,
    headers: dict[str, str] | Callable[[], dict[str, str]],
    body: str,
    kind: type[Sent | Retry | Permanent],
    fragment: str | None,
    retry_after: float | None,
) -> None:
    headers = headers() if callable(headers) else headers
    httpserver.expect_oneshot_request("/hook", method="POST").respond_with_response(
        Response(body, status=status, headers=headers)
    )
    outcome = make_provider().send(notification(httpserver.url_for("/hook")))
    httpserver.check_assertions()
    assert type(outcome) is kind
    if isinstance(outcome, Sent):
        assert outcome.provider_message_id == "notification-42"
        return
    assert fragment is not None
    assert fragment in outcome.error
    assert len(outcome.error) <= 500  # a huge error body is cut short
    assert SECRET not in outcome.error
    if status == 301:
        assert "not followed" in outcome.error
    if isinstance(outcome, Retry):
        if retry_after is None:
            assert outcome.retry_after is None
        else:
            assert outcome.retry_after == pytest.approx(retry_after, abs=3)


def test_garbage_reply_is_retried(
    make_provider: MakeProvider, raw_server: Callable[[Behaviour], RawServer]
) -> None:
    server = raw_server(garbage)
    outcome = make_provider().send(notification(server.url + "/hook"))
    assert isinstance(outcome, Retry)
    assert "127.0.0.1" in outcome.error
    assert server.accepted == 1


def test_refused_connection_is_retried(make_provider: MakeProvider) -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]  # closed on leaving the block: nothing listens there now
    outcome = make_provider().send(notification(f"http://127.0.0.1:{port}/hook"))
    assert isinstance(outcome, Retry)
    assert "ConnectError" in outcome.error


def test_silent_server_times_out(
    make_provider: MakeProvider, raw_server: Callable[[Behaviour], RawServer]
) -> None:
    server = raw_server(silence)
    provider = make_provider(timeout=1)
    started = time.monotonic()
    outcome = provider.send(notification(server.url + "/hook"))
    elapsed = time.monotonic() - started
    assert server.accepted == 1  # the fault happened: it took the request and said nothing
    assert isinstance(outcome, Retry)
    assert "timed out" in outcome.error
    assert "1s limit" in outcome.error
    assert 0.9 <= elapsed < 3


def test_connections_survive_close_between_batches(
    make_provider: MakeProvider, raw_server: Callable[[Behaviour], RawServer]
) -> None:
    hung_up = threading.Event()

    def keep_alive(conn: socket.socket, _: threading.Event) -> None:
        while read_request(conn) is not None:
            server.requests += 1
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        hung_up.set()

    server = raw_server(keep_alive)
    provider = make_provider()
    for batch in range(3):
        assert isinstance(provider.send(notification(server.url + "/hook", id=batch)), Sent)
        provider.close()
    assert (server.accepted, server.requests) == (1, 3)
    provider.shutdown()
    assert hung_up.wait(2), "shutdown() should close the kept-alive connection"


# -- what the receiver gets ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("secret", "key"),
    [(SECRET, b"0123456789abcdef0123456789abcdef"), ("plain secret", b"plain secret")],
    ids=["whsec", "plain"],
)
def test_requests_are_signed(
    make_provider: MakeProvider, httpserver: HTTPServer, secret: str, key: bytes
) -> None:
    httpserver.expect_request("/hook", method="POST").respond_with_data("ok")
    provider = make_provider(secret=secret)
    row = notification(httpserver.url_for("/hook"))
    for _ in range(2):
        assert isinstance(provider.send(row), Sent)
    assert len(httpserver.log) == 2
    for request, _ in httpserver.log:
        msg_id = request.headers["webhook-id"]
        timestamp = request.headers["webhook-timestamp"]
        signed = f"{msg_id}.{timestamp}.".encode() + request.get_data()
        expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        assert hmac.compare_digest(request.headers["webhook-signature"], f"v1,{expected}")
        assert msg_id == "notification-42"
        assert abs(int(timestamp) - time.time()) < 5
        assert request.headers["User-Agent"].startswith("notifier/")


def test_unsigned_requests_still_carry_an_id(
    make_provider: MakeProvider, httpserver: HTTPServer
) -> None:
    httpserver.expect_request("/hook", method="POST").respond_with_data("ok")
    row = notification(httpserver.url_for("/hook"))
    assert isinstance(make_provider(secret=None).send(row), Sent)
    ((request, _),) = httpserver.log
    assert request.headers["webhook-id"] == "notification-42"
    assert "webhook-signature" not in request.headers


def test_body_round_trips(make_provider: MakeProvider, httpserver: HTTPServer) -> None:
    httpserver.expect_request("/hook", method="POST").respond_with_data("ok")
    payload = {"headers": {"X-Ignored": "1"}, "items": [1, 2.5, None, True], "name": "Zoë ✓"}
    row = notification(httpserver.url_for("/hook"), id=9, subject=None, payload=payload)
    assert isinstance(make_provider().send(row), Sent)
    ((request, _),) = httpserver.log
    expected = {"id": 9, "subject": None, "body": row.body, "payload": payload}
    assert request.get_data() == json.dumps(expected, separators=(",", ":")).encode()
    assert json.loads(request.get_data()) == expected
    assert request.headers["Content-Type"] == "application/json"
    assert "X-Ignored" not in request.headers


def test_concurrent_sends_arrive_once_each(
    make_provider: MakeProvider, httpserver: HTTPServer
) -> None:
    httpserver.expect_request("/hook", method="POST").respond_with_data("ok")
    provider = make_provider()
    rows = [notification(httpserver.url_for("/hook"), id=i) for i in range(30)]
    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(provider.send, rows))
    assert all(isinstance(o, Sent) for o in outcomes)
    ids = sorted(request.headers["webhook-id"] for request, _ in httpserver.log)
    assert ids == sorted(f"notification-{i}" for i in range(30))


# -- rows that can never be sent -----------------------------------------------------------------

INVALID = [
    ("", "recipient is empty"),
    ("   ", "recipient is empty"),
    ("example.com/hook", "not an absolute URL"),
    ("/hook", "not an absolute URL"),
    ("https://", "not an absolute URL"),
    ("ftp://example.com/hook", "scheme 'ftp' is not supported"),
    ("{base}/hook", "NOTIFIER_WEBHOOK_ALLOW_HTTP"),
    ("{base}/a hook", "whitespace"),
    ("{base}/hook\r\nX-Injected: 1", "whitespace"),
    ("https://example.com/" + "a" * 2100, "at most 2048"),
    ("https://example.com:99999/hook", "malformed"),
    ("https://example.com:0/hook", "port 0, which no connection can reach"),
    ("https://hooks..example.com/hook", "has an empty label"),
    ("https://xn--zz.example.com/hook", "not a valid internationalised"),
]


@pytest.mark.parametrize(("url", "message"), INVALID, ids=[m for _, m in INVALID])
def test_invalid_recipients_are_refused(
    make_provider: MakeProvider, httpserver: HTTPServer, url: str, message: str
) -> None:
    provider = make_provider(allow_http=False)
    row = notification(url.format(base=httpserver.url_for("").rstrip("/")))
    with pytest.raises(InvalidNotification, match=message):
        provider.validate(row)
    assert httpserver.log == []


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/hook",
        "https://user:pw@example.com/h?a=1",
        "https://[2001:db8::1]:8443/x",  # refused by address unless allowed, see below
        "https://203.0.113.9/x",
        "https://[fd00::1]/x",
    ],
)
def test_valid_recipients_pass(make_provider: MakeProvider, url: str) -> None:
    provider = make_provider(allow_http=False, allowed="2001:db8::/32,203.0.113.0/24,fd00::/64")
    provider.validate(notification(url))


def test_credentials_in_the_url_stay_out_of_errors(
    make_provider: MakeProvider, httpserver: HTTPServer
) -> None:
    httpserver.expect_request("/hook").respond_with_data("nope", status=500)
    url = httpserver.url_for("/hook").replace("http://", "http://user:hunter2@")
    outcome = make_provider().send(notification(url))
    assert isinstance(outcome, Retry)
    assert "hunter2" not in outcome.error
    request, _ = httpserver.log[0]
    assert request.authorization is not None
    assert request.authorization.password == "hunter2"


# -- targets on internal networks (SSRF) ---------------------------------------------------------


class Listener:
    """A socket that listens and never accepts.

    The kernel completes the TCP handshake of any connection to it and queues it, so
    ``connections()`` counts every connection that reached it, answered or not.
    """

    def __init__(self, host: str) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.create_server((host, 0), family=family)
        self.sock.setblocking(False)
        self.port: int = self.sock.getsockname()[1]

    def connections(self) -> int:
        count = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return count
            conn.close()
            count += 1


@pytest.fixture
def listeners() -> Iterator[dict[str, Listener]]:
    """One listener on 127.0.0.1 and, where this machine has IPv6, one on ::1."""
    made = {"v4": Listener("127.0.0.1")}
    with contextlib.suppress(OSError):
        made["v6"] = Listener("::1")
    yield made
    for listener in made.values():
        listener.sock.close()


REFUSED = [
    # host as written in the URL, what the error says, whether validate() already refuses it
    ("127.0.0.1", "webhook target 127.0.0.1 is a loopback address (in 127.0.0.0/8)", True),
    ("localhost", "webhook target localhost resolves to ", False),  # 127.0.0.1 and/or ::1
    ("0x7f.0.0.1", "webhook target 0x7f.0.0.1 resolves to 127.0.0.1, a loopback address", False),
    ("0x7f.1", "resolves to 127.0.0.1, a loopback address (in 127.0.0.0/8)", False),
    ("0.0.0.0", "webhook target 0.0.0.0 is an unspecified address (in 0.0.0.0/8)", True),
    ("[::ffff:127.0.0.1]", "is an IPv4-mapped loopback address (in 127.0.0.0/8)", True),
    ("[::1]", "webhook target ::1 is a loopback address (in ::1/128)", True),
]
# What the refused hosts above need to be let through, for the control in the test below.
LETS_THROUGH = "127.0.0.0/8,::1/128,0.0.0.0/32"


@pytest.mark.parametrize(("host", "fragment", "literal"), REFUSED, ids=[r[0] for r in REFUSED])
def test_internal_targets_are_refused_without_a_connection(
    make_provider: MakeProvider,
    listeners: dict[str, Listener],
    host: str,
    fragment: str,
    literal: bool,
) -> None:
    listener = listeners.get("v6" if host == "[::1]" else "v4")
    if listener is None:
        pytest.skip("no IPv6 loopback on this machine")
    row = notification(f"http://{host}:{listener.port}/hook")
    provider = make_provider(allowed="", timeout=0.5)
    if literal:
        with pytest.raises(InvalidNotification) as refused:
            provider.validate(row)
        assert fragment in str(refused.value)
    else:
        provider.validate(row)  # a name: only resolving it can tell
    # The connection's own check, which does not rely on validate() having run.
    outcome = provider.send(row)
    assert isinstance(outcome, Permanent)
    assert fragment in outcome.error
    assert outcome.error.endswith("allow that network with NOTIFIER_WEBHOOK_ALLOWED_NETWORKS")
    assert listener.connections() == 0
    # Control: allowed, the same row does reach the listener (which never answers).
    assert isinstance(make_provider(allowed=LETS_THROUGH, timeout=0.5).send(row), Retry)
    assert listener.connections() == 1


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("127.0.0.1", "127.0.0.0/8"),
        ("0x7f.1", "127.0.0.0/8"),
        ("[::ffff:127.0.0.1]", "127.0.0.0/8"),  # allowed through the IPv4 network it maps
        ("localhost", LOOPBACK),
        ("127.0.0.1", "10.0.0.0/8, 127.0.0.1/32"),
    ],
)
def test_allowed_networks_are_sent_to(
    make_provider: MakeProvider,
    raw_server: Callable[[Behaviour], RawServer],
    host: str,
    allowed: str,
) -> None:
    def ok(conn: socket.socket, _: threading.Event) -> None:
        if read_request(conn) is not None:
            server.requests += 1
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    server = raw_server(ok)
    url = (server.url + "/hook").replace("127.0.0.1", host)
    assert isinstance(make_provider(allowed=allowed).send(notification(url)), Sent)
    assert server.requests == 1


@pytest.mark.parametrize("host", ["127.1", "2130706433", "127.0.0.1."])
def test_legacy_numeric_addresses_are_refused_even_when_allowed(
    make_provider: MakeProvider, listeners: dict[str, Listener], host: str
) -> None:
    """The C library reads these as 127.0.0.1; notifier refuses to guess what they mean."""
    row = notification(f"http://{host}:{listeners['v4'].port}/hook")
    provider = make_provider(allowed=LETS_THROUGH, timeout=0.5)
    with pytest.raises(InvalidNotification, match="legacy short or numeric form"):
        provider.validate(row)
    outcome = provider.send(row)  # the client's own refusal, without validate()
    assert isinstance(outcome, Permanent)
    assert host in outcome.error
    assert listeners["v4"].connections() == 0


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://10.1.2.3/hook", ""),
        ("https://192.168.0.10/hook", "10.0.0.0/8"),
        ("https://169.254.169.254/latest/meta-data/", ""),
        ("https://[fd00::1]/hook", "fd00:0:0:1::/64"),
        ("https://[fe80::1]/hook", ""),
        ("https://100.64.0.1/hook", ""),
        ("https://[::]/hook", ""),
    ],
)
def test_internal_literals_fail_validation(
    make_provider: MakeProvider, url: str, allowed: str
) -> None:
    """Pure: validate() looks at the literal and never connects (no traffic off loopback)."""
    provider = make_provider(allow_http=False, allowed=allowed)
    with pytest.raises(InvalidNotification, match="NOTIFIER_WEBHOOK_ALLOWED_NETWORKS"):
        provider.validate(notification(url))


def test_a_redirect_to_an_internal_address_is_not_followed(
    make_provider: MakeProvider, httpserver: HTTPServer, listeners: dict[str, Listener]
) -> None:
    inside = f"http://127.0.0.1:{listeners['v4'].port}/latest/meta-data/"
    httpserver.expect_oneshot_request("/hook").respond_with_response(
        Response("", status=302, headers={"Location": inside})
    )
    outcome = make_provider().send(notification(httpserver.url_for("/hook")))
    assert isinstance(outcome, Permanent)
    assert "redirects are not followed" in outcome.error
    assert listeners["v4"].connections() == 0


def test_a_host_that_cannot_be_resolved_is_retried(make_provider: MakeProvider) -> None:
    # A 64-character label fails in the IDNA codec, before any query: no traffic leaves.
    outcome = make_provider().send(notification("http://" + "a" * 64 + ".example/hook"))
    assert isinstance(outcome, Retry)
    assert "cannot resolve" in outcome.error
