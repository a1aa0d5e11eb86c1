"""The events endpoint under attack by generation: no request, however malformed, is answered
500, and none without valid authentication changes the database or Redis or fetches a
certificate. ``notifier events`` runs as a real process (``tests.events_endpoint``) against
real PostgreSQL and Redis; requests are signed for real where a property needs them to pass.

A fixed budget per property (``NOTIFIER_TEST_EVENTS_ATTACK_EXAMPLES``, 150 by default),
derandomized: the same examples on every run, so CI is repeatable. Each property runs one
endpoint process and, after every request, checks the database and Redis for any change.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine

from tests.events_endpoint import (
    DEEP,
    PUBLIC,
    TOPIC,
    TWILIO_TOKEN,
    Endpoint,
    mailgun_signature,
    postmark_auth,
    redis_keys,
    signed_sendgrid,
)
from tests.factories import MakeRow
from tests.integration.test_events import SENT, sns_signed, sql

EXAMPLES = int(os.environ.get("NOTIFIER_TEST_EVENTS_ATTACK_EXAMPLES", "150"))
PROVIDERS = ["/ses", "/sendgrid", "/mailgun", "/postmark", "/twilio"]
PATHS = [*PROVIDERS, "/u/", "/health", "/", ""]
HEADER_NAMES = [
    "authorization",
    "content-type",
    "content-length",
    "transfer-encoding",
    "host",
    "x-twilio-signature",
    "x-twilio-email-event-webhook-signature",
    "x-twilio-email-event-webhook-timestamp",
    "x-amz-sns-message-type",
    "x-forwarded-for",
]
#: Bodies no JSON writer means, beside the generated documents.
HOSTILE_JSON = [
    b"",
    b"NaN",
    b"[Infinity]",
    b'{"timestamp": -Infinity}',
    b"1e999",
    b"[1e999]",
    b"9" * 5000,
    DEEP,
    b'{"a":' * 5000 + b"1" + b"}" * 5000,
    b'"\\ud800"',
    b'{"\\udc00": "x"}',
    b"\xff\xfe\x00\x00",
    b"\xef\xbb\xbf{}",
    b"{" * 3,
    b"[]" * 1000,
]
attack = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
    | st.sampled_from(["1", "2", TOPIC, "Notification", "SubscriptionConfirmation", "bounce"])
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=16,
)
json_bodies = st.one_of(
    json_values.map(lambda v: json.dumps(v).encode()),
    st.sampled_from(HOSTILE_JSON),
    st.binary(max_size=64),
)
#: Paths with what routers and proxies read two ways: slashes, dots, percent-encoding.
path_tails = st.lists(
    st.sampled_from(
        ["/", "..", ".", "%2e%2e", "%2f", "%00", "%ff", "\\", "//", "?", "#", ";", "ses", "u", "x"]
    )
    | st.text(max_size=6),
    max_size=6,
).map("".join)


@dataclass
class Seen:
    """What the database and Redis hold: a refused request must leave it as it was."""

    tables: list[tuple[Any, ...]]
    keys: list[bytes]
    #: the endpoint's counts but its refusals
    counted: dict[bytes, bytes]


def seen(engine: Engine, redis_url: str) -> Seen:
    tables = sql(
        engine,
        "SELECT (SELECT count(*) FROM notifications),"
        " (SELECT count(*) FROM notification_attempts),"
        " (SELECT count(*) FROM suppressions),"
        " (SELECT string_agg(concat_ws('|', id, status, delivery_status, delivery_detail), ','"
        "   ORDER BY id) FROM notifications)",
    )
    client = redis.Redis.from_url(redis_url)
    try:
        counts = client.hgetall("notifier:metrics:events")
        counted = {k: v for k, v in counts.items() if not k.endswith(b"|refused")}
    finally:
        client.close()
    return Seen(tables, redis_keys(redis_url), counted)


def assert_unchanged(before: Seen, engine: Engine, redis_url: str) -> None:
    after = seen(engine, redis_url)
    assert (after.tables, after.keys, after.counted) == (before.tables, before.keys, before.counted)


def raw_status(port: int, request: bytes) -> int | None:
    """Send ``request`` as it is over a fresh connection; the answer's status, if any."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(request)
        conn.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    head = answer.split(b"\r\n", 1)[0].split(b" ")
    return int(head[1]) if len(head) > 1 and head[0].startswith(b"HTTP/") else None


@pytest.fixture
def seeded(make_row: MakeRow) -> list[int]:
    """Rows a forged report could be about: ids 1.., recipients and message ids to aim at."""
    return [
        make_row(
            **SENT,
            channel=channel,
            recipient=recipient,
            provider_message_id=f"SM{n}",
        )
        for n, (channel, recipient) in enumerate(
            [("email", "ann@example.com"), ("email", "bob@example.com"), ("sms", "+14155550100")]
        )
    ]


@attack
@given(
    method=st.sampled_from([b"GET", b"POST", b"PUT", b"HEAD", b"OPTIONS", b"DELETE"])
    | st.binary(min_size=1, max_size=8),
    path=st.tuples(st.sampled_from(PATHS), path_tails).map(lambda p: (p[0] + p[1]).encode()),
    headers=st.lists(
        st.tuples(
            st.sampled_from(HEADER_NAMES).map(str.encode) | st.binary(max_size=8),
            st.binary(max_size=40),
        ),
        max_size=5,
    ),
    body=json_bodies,
)
def test_no_request_line_or_header_bytes_get_a_500_or_change_anything(
    endpoint: Endpoint,
    engine: Engine,
    redis_url: str,
    seeded: list[int],
    method: bytes,
    path: bytes,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
) -> None:
    before = seen(engine, redis_url)
    lines = [method + b" " + (path or b"/") + b" HTTP/1.1", b"host: 127.0.0.1"]
    lines += [name + b": " + value for name, value in headers]
    if not any(name.lower() in (b"content-length", b"transfer-encoding") for name, _ in headers):
        lines.append(b"content-length: %d" % len(body))
    request = b"\r\n".join(lines) + b"\r\n\r\n" + body
    status = raw_status(endpoint.port, request)
    assert status is None or status < 500, request[:300]
    assert endpoint.proc.poll() is None
    assert_unchanged(before, engine, redis_url)
    assert endpoint.certs.fetches == []


@attack
@given(
    path=st.sampled_from(PROVIDERS),
    body=json_bodies,
    auth=st.sampled_from(["none", "wrong", "stale"]),
    data=st.data(),
)
def test_unauthenticated_documents_of_any_shape_are_refused_and_change_nothing(
    endpoint: Endpoint,
    engine: Engine,
    redis_url: str,
    seeded: list[int],
    path: str,
    body: bytes,
    auth: str,
    data: st.DataObject,
) -> None:
    before = seen(engine, redis_url)
    headers: dict[str, str | bytes] = {}
    if path == "/sendgrid" and auth != "none":
        stamp = str(int(time.time()) - (3600 if auth == "stale" else 0))
        headers = {**signed_sendgrid(endpoint, body + b" ", stamp)}  # signed another body
    if path == "/postmark" and auth != "none":
        headers = {"Authorization": "Basic " + base64.b64encode(b"postmark:guess").decode()}
    if path == "/twilio" and auth != "none":
        headers = {"X-Twilio-Signature": base64.b64encode(bytes(20)).decode()}
    if path == "/mailgun" and auth != "none" and body.startswith(b"{"):
        doc = data.draw(json_values, label="event-data")
        stamp = str(int(time.time()) - (3600 if auth == "stale" else 0))
        signed = mailgun_signature("tok-attack", stamp)
        signed["signature"] = signed["signature"] if auth == "stale" else "0" * 64
        body = json.dumps({"signature": signed, "event-data": doc}).encode()
    answer = endpoint.post(path, body, **headers)
    assert 400 <= answer.status_code < 500, (answer.status_code, answer.text, body[:200])
    assert "\n" not in answer.text
    assert_unchanged(before, engine, redis_url)
    assert endpoint.certs.fetches == []


sns_fields = st.fixed_dictionaries(
    {},
    optional={
        key: json_values | st.just(value)
        for key, value in {
            "Type": "Notification",
            "MessageId": "m-1",
            "Message": "{}",
            "Timestamp": "2026-12-01T10:00:00.000Z",
            "TopicArn": TOPIC,
            "SignatureVersion": "2",
            "Signature": "AAAA",
            "Subject": "s",
            "SubscribeURL": "x",
            "Token": "t",
        }.items()
    },
)


@attack
@given(doc=sns_fields, cert_path=path_tails)
def test_sns_documents_of_any_shape_fetch_nothing_unless_plain_and_for_the_topic(
    endpoint: Endpoint,
    engine: Engine,
    redis_url: str,
    seeded: list[int],
    doc: dict[str, Any],
    cert_path: str,
) -> None:
    before = seen(engine, redis_url)
    doc = {**doc, "SigningCertURL": endpoint.cert_base + "/" + cert_path + ".pem"}
    answer = endpoint.post("/ses", json.dumps(doc).encode())
    assert answer.status_code in (400, 403), answer.text
    assert_unchanged(before, engine, redis_url)
    plain = re.compile(r"(/[A-Za-z0-9_-][A-Za-z0-9_.-]*)+\.pem")
    assert [f for f in endpoint.certs.fetches if not plain.fullmatch(f)] == []
    if doc.get("TopicArn") != TOPIC:
        assert endpoint.certs.fetches == []


@attack
@given(
    provider=st.sampled_from(["/ses", "/sendgrid", "/mailgun", "/postmark", "/twilio"]),
    fields=st.dictionaries(
        st.sampled_from(
            [
                "event",
                "email",
                "timestamp",
                "notifier_id",
                "type",
                "reason",
                "sg_message_id",
                "recipient",
                "severity",
                "user-variables",
                "message",
                "delivery-status",
                "RecordType",
                "Type",
                "BouncedAt",
                "DeliveredAt",
                "Email",
                "Metadata",
                "MessageID",
                "notificationType",
                "mail",
                "bounce",
                "delivery",
                "complaint",
            ]
        ),
        json_values
        | st.sampled_from(["delivered", "bounce", "failed", "Bounce", "Delivery", "SpamComplaint"])
        | st.sampled_from(
            [1_700_000_000, 1e20, -1, 2**63, "2026-12-01T10:00:00Z", "0001-01-01T00:00:00+01:00"]
        ),
        max_size=8,
    ),
    form=st.lists(st.tuples(st.text(max_size=12), st.text(max_size=20)), max_size=6),
)
def test_signed_reports_of_any_shape_get_200_or_400(
    endpoint: Endpoint,
    engine: Engine,
    redis_url: str,
    seeded: list[int],
    provider: str,
    fields: dict[str, Any],
    form: list[tuple[str, str]],
) -> None:
    token = f"tok-{uuid.uuid4().hex}"
    if provider == "/ses":
        message = {
            "Type": "Notification",
            "MessageId": "m",
            "TopicArn": TOPIC,
            "Timestamp": "2026-12-01T10:00:00.000Z",
            "Message": json.dumps(fields),
        }
        answer = endpoint.post("/ses", json.dumps(sns_signed(endpoint, message)).encode())
    elif provider == "/sendgrid":
        body = json.dumps([fields, fields]).encode()
        answer = endpoint.post(provider, body, **signed_sendgrid(endpoint, body))
    elif provider == "/mailgun":
        doc = {"signature": mailgun_signature(token), "event-data": fields}
        answer = endpoint.post(provider, json.dumps(doc).encode())
    elif provider == "/postmark":
        answer = endpoint.post(provider, json.dumps(fields).encode(), **postmark_auth())
    else:
        params = [(k, v) for k, v in dict(form).items()]
        data = PUBLIC + "/twilio" + "".join(k + v for k, v in sorted(params))
        mac = hmac.new(TWILIO_TOKEN.encode(), data.encode(), hashlib.sha1).digest()
        answer = endpoint.post(
            provider,
            urlencode(params).encode(),
            **{
                "X-Twilio-Signature": base64.b64encode(mac).decode(),
                "Content-Type": "application/x-www-form-urlencoded",
            },
        )
    assert answer.status_code in (200, 400), (answer.status_code, answer.text, fields, form)
    spent = redis_keys(redis_url).count(f"notifier:events:mailgun-token:{token}".encode())
    assert spent == (provider == "/mailgun" and answer.status_code == 200)
    assert endpoint.certs.fetches in ([], ["/cert.pem"])


@attack
@given(
    # what h11 lets a client put in a header: no control characters, no spaces around
    stamp=st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zs", "Zl", "Zp")), max_size=14)
    | st.integers(min_value=-(2**64), max_value=2**64).map(str)
    | st.floats().map(str)
    | st.sampled_from(["\u00b2", "\u0661", "1e20", "NaN", "0x10", "+1", "1_700_000_000"])
    | st.builds(lambda: str(int(time.time()))),
    provider=st.sampled_from(["/sendgrid", "/mailgun"]),
)
def test_signed_timestamps_other_than_fresh_seconds_are_refused(
    endpoint: Endpoint,
    engine: Engine,
    redis_url: str,
    seeded: list[int],
    stamp: str,
    provider: str,
) -> None:
    before = seen(engine, redis_url)
    event = {
        "event": "delivered",
        "email": "ann@example.com",
        "timestamp": 1_700_000_000,
        "notifier_id": str(seeded[0]),
    }
    if provider == "/sendgrid":
        body = json.dumps([event]).encode()
        answer = endpoint.post(provider, body, **signed_sendgrid(endpoint, body, stamp))
    else:
        signed = mailgun_signature(f"tok-{uuid.uuid4().hex}", stamp)
        doc = {"signature": signed, "event-data": event}
        answer = endpoint.post(provider, json.dumps(doc).encode())
    fresh = stamp.isascii() and stamp.isdigit() and abs(time.time() - int(stamp)) < 300
    assert answer.status_code == 200 if fresh else answer.status_code in (401, 403), answer.text
    if not fresh:
        assert_unchanged(before, engine, redis_url)
