"""Reports and unsubscribes apply to their own row and address, through the running endpoint.

``notifier events`` runs as a real process (the integration tests' ``endpoint`` fixture);
requests are signed as each provider signs them. Each refusal is checked against the same
request that is applied once it names the right thing, so it cannot pass by the endpoint
refusing everything.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

import redis
from sqlalchemy import Engine

from notifier import unsubscribe
from notifier.metrics import EVENTS_KEY
from tests.factories import MakeRow
from tests.integration.test_events import (
    POSTMARK_AUTH,
    SECRET,
    SENT,
    Endpoint,
    delivery,
    sql,
    twilio_post,
)

AUTH = {"Authorization": "Basic " + base64.b64encode(POSTMARK_AUTH.encode()).decode()}


def postmark_bounce(row: int, email: str) -> bytes:
    return json.dumps(
        {
            "RecordType": "Bounce",
            "Type": "HardBounce",
            "Description": "The server was unable to deliver your message",
            "MessageID": "883953f4-6105-42a2-a16a-77a8eac79483",
            "Email": email,
            "BouncedAt": "2026-12-01T10:00:00Z",
            "Metadata": {"notifier-id": str(row)},
        }
    ).encode()


def counted(redis_url: str, field: str) -> int:
    client = redis.Redis.from_url(redis_url)
    try:
        return int(client.hget(EVENTS_KEY, field) or 0)
    finally:
        client.close()


def entries(engine: Engine) -> list[tuple[Any, ...]]:
    """Every suppression and scoped opt-out: (channel, recipient, category or None, reason)."""
    return sql(
        engine,
        "SELECT channel, recipient, NULL, reason FROM suppressions"
        " UNION ALL SELECT channel, recipient, category, reason FROM category_opt_outs"
        " ORDER BY 2, 3",
    )


# --- a report speaks for its own row only -------------------------------------------------------


def test_a_bounce_naming_another_address_than_its_rows_suppresses_nobody(
    endpoint: Endpoint, engine: Engine, make_row: MakeRow, redis_url: str
) -> None:
    row = make_row(**SENT, channel="email", recipient="a@example.com")
    stranger = endpoint.post("/postmark", postmark_bounce(row, "someone-else@example.com"), **AUTH)
    assert stranger.status_code == 200
    assert entries(engine) == []
    assert delivery(engine, row) == (None, None)  # nothing of the row changed either
    assert counted(redis_url, "postmark|mismatched") == 1
    assert "names another recipient than the row's" in endpoint.log.read_text()

    # The same report naming the row's own address (as written otherwise) is applied.
    own = endpoint.post("/postmark", postmark_bounce(row, " A@Example.com"), **AUTH)
    assert own.status_code == 200
    assert delivery(engine, row)[0] == "bounced"
    assert sql(engine, "SELECT recipient, kind FROM suppressions") == [("a@example.com", "bounce")]


def test_a_twilio_opt_out_for_one_message_naming_another_number_suppresses_nobody(
    endpoint: Endpoint, engine: Engine, make_row: MakeRow, redis_url: str
) -> None:
    sid = "SM0123456789abcdef0123456789abcdef"
    row = make_row(**SENT, channel="sms", recipient="+14155550100", provider_message_id=sid)
    status = {
        "MessageSid": sid,
        "MessageStatus": "undelivered",
        "ErrorCode": "21610",
        "To": "+14155550177",
        "From": "+14155550199",
        "AccountSid": "AC0123456789abcdef0123456789abcdef",
    }
    assert twilio_post(endpoint, status).status_code == 200
    assert entries(engine) == []
    assert delivery(engine, row) == (None, None)
    assert counted(redis_url, "twilio|mismatched") == 1

    assert twilio_post(endpoint, {**status, "To": "+14155550100"}).status_code == 200
    assert sql(engine, "SELECT recipient, kind FROM suppressions") == [("+14155550100", "opt-out")]


def test_a_report_about_a_purged_row_suppresses_the_address_it_names_and_says_so(
    endpoint: Endpoint, engine: Engine, make_row: MakeRow
) -> None:
    row = make_row(**SENT, channel="email", recipient="gone@example.com")
    sql(engine, "DELETE FROM notifications WHERE id = :i", i=row)  # as notifier purge does
    assert endpoint.post("/postmark", postmark_bounce(row, "gone@example.com"), **AUTH).is_success
    [(recipient, kind, reason)] = sql(engine, "SELECT recipient, kind, reason FROM suppressions")
    assert (recipient, kind) == ("gone@example.com", "bounce")
    assert reason.endswith("; its row is gone")
    assert "a postmark report about a row that no longer exists" in endpoint.log.read_text()


def test_a_complaint_is_recorded_as_one(
    endpoint: Endpoint, engine: Engine, make_row: MakeRow
) -> None:
    row = make_row(**SENT, channel="email", recipient="pm@example.com", category="news")
    body = json.dumps(
        {
            "RecordType": "SpamComplaint",
            "MessageID": "00000000-0000-0000-0000-000000000000",
            "Email": "pm@example.com",
            "BouncedAt": "2026-12-01T10:00:00Z",
            "Metadata": {"notifier-id": str(row)},
        }
    ).encode()
    assert endpoint.post("/postmark", body, **AUTH).is_success
    assert sql(engine, "SELECT recipient, kind FROM suppressions") == [
        ("pm@example.com", "complaint")
    ]


# --- one-click unsubscribe ----------------------------------------------------------------------


def link(ep: Endpoint, recipient: str, category: str = "marketing") -> str:
    return f"{ep.url}/u/{unsubscribe.make_token(SECRET, 'email', recipient, category)}"


def test_only_the_one_click_form_or_the_pages_own_form_unsubscribes(
    endpoint: Endpoint, engine: Engine, redis_url: str
) -> None:
    url = link(endpoint, "ann@example.com")
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    c = endpoint.client
    assert c.head(url).status_code == 200  # a link scanner's HEAD, through the GET route
    assert c.get(url).status_code == 200
    assert c.options(url).status_code == 405
    assert c.put(url, content=b"List-Unsubscribe=One-Click").status_code == 405
    for body in (
        b"",
        b"List-Unsubscribe=Yes",
        b"List-Unsubscribe=One-Click&List-Unsubscribe=One-Click",
        b"List-Unsubscribe=One-Click&more=1",
        b"confirm=yes",
        b"\xff\xfe",
    ):
        assert c.post(url, content=body, headers=form).status_code == 400, body
    assert entries(engine) == []
    assert counted(redis_url, "unsubscribe|applied") == 0

    assert c.post(url, content=b"List-Unsubscribe=One-Click", headers=form).status_code == 200
    # RFC 8058 recommends multipart/form-data; a second opt-out of the same changes nothing.
    multipart = c.post(url, files={"List-Unsubscribe": (None, "One-Click")})
    assert multipart.status_code == 200
    page = c.get(link(endpoint, "bob@example.com", "news"))
    assert 'name="confirm" value="unsubscribe"' in page.text
    assert "bob@example.com" not in page.text
    confirmed = c.post(link(endpoint, "bob@example.com", "news"), data={"confirm": "unsubscribe"})
    assert confirmed.status_code == 200
    assert entries(engine) == [
        ("email", "ann@example.com", "marketing", "unsubscribed (one-click, marketing)"),
        ("email", "bob@example.com", "news", "unsubscribed (one-click, news)"),
    ]


def test_a_token_says_nothing_and_cannot_be_changed(endpoint: Endpoint, engine: Engine) -> None:
    token = unsubscribe.make_token(SECRET, "email", "Ann.Lee@Example.com", "marketing")
    raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    for secret_part in (b"ann.lee", b"example", b"marketing", b"email"):
        assert secret_part not in raw.lower()
    assert token != unsubscribe.make_token(SECRET, "email", "Ann.Lee@Example.com", "marketing")
    assert unsubscribe.read_token(SECRET, token) == unsubscribe.Subscription(
        "email", "Ann.Lee@Example.com", "marketing"
    )
    assert unsubscribe.read_token("another secret", token) is None
    flipped = token[:20] + ("A" if token[20] != "A" else "B") + token[21:]
    one_click = {"content": b"List-Unsubscribe=One-Click"}
    for bad in (flipped, token[:-2], "", "x" * 5000, "a.b", "%00"):
        assert endpoint.client.post(f"{endpoint.url}/u/{bad}", **one_click).status_code in (
            403,
            404,
        )
    assert entries(engine) == []


def test_a_token_of_the_earlier_form_still_opts_out_of_marketing(
    endpoint: Endpoint, engine: Engine
) -> None:
    payload = b"email\0ann@example.com\0spring"
    mac = hmac.new(SECRET.encode(), b"notifier-unsubscribe\0" + payload, hashlib.sha256).digest()

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    url = f"{endpoint.url}/u/{b64(payload)}.{b64(mac)}"
    assert endpoint.client.post(url, content=b"List-Unsubscribe=One-Click").status_code == 200
    assert entries(engine) == [
        ("email", "ann@example.com", "marketing", "unsubscribed (one-click, marketing)")
    ]


def test_the_link_of_a_row_without_a_category_opts_out_of_everything(
    endpoint: Endpoint, engine: Engine
) -> None:
    # A row that asked for a link with payload.unsubscribe and names no category.
    token = unsubscribe.make_token(SECRET, "email", "ann@example.com", "")
    url = f"{endpoint.url}/u/{token}"
    assert "Stop these messages" in endpoint.client.get(url).text
    assert endpoint.client.post(url, content=b"List-Unsubscribe=One-Click").status_code == 200
    assert entries(engine) == [("email", "ann@example.com", None, "unsubscribed (one-click)")]
    assert sql(engine, "SELECT kind FROM suppressions") == [("opt-out",)]


def test_the_access_log_shows_no_token(endpoint: Endpoint) -> None:
    url = link(endpoint, "ann@example.com")
    token = url.rpartition("/")[2]
    endpoint.client.get(url)
    endpoint.client.head(url + "?utm=1")
    assert endpoint.client.get(endpoint.url + "/health").text == "ok"
    written = endpoint.log.read_text()
    assert '"GET /health HTTP/1.1" 200' in written  # the access log is on
    assert '"GET /u/… HTTP/1.1" 200' in written
    assert '"HEAD /u/… HTTP/1.1" 200' in written
    assert token not in written
    assert "ann@example.com" not in written


def test_a_refused_link_is_counted(endpoint: Endpoint, redis_url: str) -> None:
    assert endpoint.client.post(f"{endpoint.url}/u/bogus", content=b"").status_code == 403
    assert counted(redis_url, "unsubscribe|refused") == 1
