"""The events endpoint refuses by the cheapest check that can refuse, before anything is
fetched, parsed deeply or written, and answers a malformed request 400, never 500: the cases
reported, each first seen failing. ``notifier events`` runs as a real process
(``tests.events_endpoint``) against real PostgreSQL and Redis; requests are signed for real
where a test needs them to pass.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import redis
from sqlalchemy import Engine

from tests.events_endpoint import (
    DEEP,
    TOPIC,
    Endpoint,
    mailgun_signature,
    postmark_auth,
    redis_keys,
    signed_sendgrid,
)
from tests.factories import MakeRow
from tests.integration.test_events import SENT, delivery, ses_bounce, sns_signed

# --- SNS: nothing fetched before the cheap checks, and each certificate fetched once ----------


def test_sns_checks_everything_cheap_before_fetching_a_certificate(
    endpoint: Endpoint, engine: Engine, make_row: MakeRow
) -> None:
    row = make_row(**SENT, channel="email", recipient="ann@example.com")
    good = sns_signed(endpoint, ses_bounce(row, "ann@example.com"))
    base = endpoint.cert_base
    hostile: list[dict[str, Any]] = [
        *({**good, "TopicArn": f"{TOPIC}-{n}"} for n in range(60)),  # anyone's topic
        {**good, "TopicArn": [TOPIC]},
        {**good, "TopicArn": {"a": TOPIC}},
        {**good, "Type": "Notification "},
        {**good, "Type": ["Notification"]},
        {**good, "Message": {"notificationType": "Bounce"}},
        {**good, "MessageId": 7},
        {**good, "Timestamp": "yesterday"},
        {**good, "Signature": None},
        {**good, "Signature": "not base64!"},
        {**good, "SignatureVersion": 2.0},
        {**good, "SigningCertURL": base + "/cert.pem\n"},
        {**good, "SigningCertURL": base + "/\nhttp://evil.example/cert.pem"},
        {**good, "SigningCertURL": base + "/%63ert.pem"},
        {**good, "SigningCertURL": base + "/x/../cert.pem"},
        {**good, "SigningCertURL": base + "//evil.example/cert.pem"},
        {**good, "SigningCertURL": base + "/cert.pem?x=1"},
        {**good, "SigningCertURL": base + "/cert.pem#x"},
        {**good, "SigningCertURL": base + "/cert.pem\\@evil.example"},
        {**good, "SigningCertURL": base + "/c\u00e9rt.pem"},
        {**good, "SigningCertURL": base + "/cert.txt"},
    ]
    answers = [endpoint.post("/ses", json.dumps(doc).encode()).status_code for doc in hostile]
    assert [a for a in answers if a not in (400, 403)] == []
    assert endpoint.certs.fetches == []
    assert delivery(engine, row) == (None, None)

    assert endpoint.post("/ses", json.dumps(good).encode()).status_code == 200
    assert endpoint.certs.fetches == ["/cert.pem"]
    assert delivery(engine, row)[0] == "bounced"


def test_concurrent_sns_posts_share_one_certificate_fetch(
    endpoint: Endpoint, make_row: MakeRow
) -> None:
    endpoint.certs.delay = 0.5  # every first request arrives while the fetch is in flight
    rows = [make_row(**SENT, channel="email", recipient=f"r{i}@example.com") for i in range(16)]
    bodies = [
        json.dumps(sns_signed(endpoint, ses_bounce(row, f"r{i}@example.com"))).encode()
        for i, row in enumerate(rows)
    ]

    def post(body: bytes) -> int:
        return httpx.post(endpoint.url + "/ses", content=body, timeout=30).status_code

    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(post, bodies))
    assert answers == [200] * len(bodies)
    assert endpoint.certs.fetches == ["/cert.pem"]


def test_a_failed_certificate_fetch_is_not_repeated_for_every_post(endpoint: Endpoint) -> None:
    doc = {**sns_signed(endpoint, ses_bounce(1, "x@example.com"))}
    doc["SigningCertURL"] = endpoint.cert_base + "/missing.pem"  # answered 404
    answers = {endpoint.post("/ses", json.dumps(doc).encode()).status_code for _ in range(80)}
    assert answers == {403}
    assert endpoint.certs.fetches == ["/missing.pem"]


# --- malformed documents: 400 with a reason, never 500 ------------------------------------------


def test_json_of_any_depth_is_refused_with_400(endpoint: Endpoint) -> None:
    assert endpoint.post("/ses", DEEP).status_code == 400
    assert endpoint.post("/mailgun", DEEP).status_code == 400
    assert endpoint.post("/sendgrid", DEEP, **signed_sendgrid(endpoint, DEEP)).status_code == 400
    assert endpoint.post("/postmark", DEEP, **postmark_auth()).status_code == 400
    deep_message = sns_signed(endpoint, {**ses_bounce(1, "x@example.com"), "Message": "[" * 10_000})
    answer = endpoint.post("/ses", json.dumps(deep_message).encode())
    assert answer.status_code == 400, answer.text


IMPOSSIBLE_NUMBERS = [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"1e20", b"-1e20", b"9" * 5000]


def test_signed_reports_with_impossible_timestamps_are_refused_and_spend_nothing(
    endpoint: Endpoint, redis_url: str
) -> None:
    for n, number in enumerate(IMPOSSIBLE_NUMBERS):
        event = b'[{"event": "delivered", "email": "a@example.com", "timestamp": %s}]' % number
        answer = endpoint.post("/sendgrid", event, **signed_sendgrid(endpoint, event))
        assert answer.status_code == 400, (number[:20], answer.text)

        signature = json.dumps(mailgun_signature(f"tok-{n}")).encode()
        data = b'{"event": "delivered", "recipient": "a@example.com", "timestamp": %s}' % number
        body = b'{"signature": %s, "event-data": %s}' % (signature, data)
        answer = endpoint.post("/mailgun", body)
        assert answer.status_code == 400, (number[:20], answer.text)
        assert redis_keys(redis_url) == []  # the token is not spent on a report refused
        fine = body.replace(b'"timestamp": ' + number, b'"timestamp": 1700000000')
        assert endpoint.post("/mailgun", fine).status_code == 200
        assert endpoint.post("/mailgun", fine).status_code == 403  # now it is spent
        client = redis.Redis.from_url(redis_url)
        client.flushdb()
        client.close()


def test_signature_timestamps_that_are_not_plain_seconds_are_refused(
    endpoint: Endpoint, redis_url: str
) -> None:
    body = b'[{"event": "delivered", "email": "a@example.com", "timestamp": 1700000000}]'
    for stamp in ["\u00b2", "\u0661\u0662", "1e20", "NaN", "-5", "+1", "9" * 5000, "1.5"]:
        answer = endpoint.post("/sendgrid", body, **signed_sendgrid(endpoint, body, stamp))
        assert answer.status_code == 403, (stamp[:20], answer.text)
        doc = {"signature": mailgun_signature("tok-stamp", stamp), "event-data": {"event": "x"}}
        answer = endpoint.post("/mailgun", json.dumps(doc).encode())
        assert answer.status_code == 403, (stamp[:20], answer.text)
    assert redis_keys(redis_url) == []


def test_mailgun_signatures_of_the_wrong_shape_are_refused(
    endpoint: Endpoint, redis_url: str
) -> None:
    for signed in [
        {"timestamp": 1700000000, "token": "t", "signature": "00"},
        {"timestamp": "1700000000", "token": ["t"], "signature": "00"},
        {"timestamp": "1700000000", "token": "t", "signature": "\u00e9" * 64},
        {"timestamp": "1700000000", "token": "t" * 10_000, "signature": "00"},
        [],
        "signature",
    ]:
        doc = {"signature": signed, "event-data": {"event": "delivered", "timestamp": 1700000000}}
        answer = endpoint.post("/mailgun", json.dumps(doc).encode())
        assert answer.status_code in (401, 403), (signed, answer.text)
    assert redis_keys(redis_url) == []


def test_bodies_that_are_not_documents_are_refused_with_400(endpoint: Endpoint) -> None:
    for body in [b"", b"\xff\xfe\x00garbage", b"null", b"1e999", b'"x"', b"{", b"[]" * 3]:
        for path, headers in [
            ("/ses", {}),
            ("/mailgun", {}),
            ("/sendgrid", signed_sendgrid(endpoint, body)),
            ("/postmark", postmark_auth()),
        ]:
            answer = endpoint.post(path, body, **headers)
            assert answer.status_code == 400, (path, body, answer.text)


def test_header_values_beyond_ascii_are_refused_not_crashed_on(endpoint: Endpoint) -> None:
    form = b"MessageSid=SM1&MessageStatus=delivered"
    headers = [("X-Twilio-Signature", "\u00e9t\u00e9".encode("latin-1") * 9 + b"=")]
    answer = httpx.post(endpoint.url + "/twilio", content=form, headers=headers)
    assert answer.status_code == 403, answer.text
    sendgrid = [
        ("X-Twilio-Email-Event-Webhook-Signature", b"\xe9\xe9"),
        ("X-Twilio-Email-Event-Webhook-Timestamp", str(int(time.time())).encode()),
    ]
    answer = httpx.post(endpoint.url + "/sendgrid", content=b"[]", headers=sendgrid)
    assert answer.status_code == 403, answer.text
    postmark = [("Authorization", b"Basic \xe9\xe9")]
    answer = httpx.post(endpoint.url + "/postmark", content=b"{}", headers=postmark)
    assert answer.status_code == 401, answer.text
