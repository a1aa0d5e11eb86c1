"""``notifier events`` as a real process on loopback, fed requests built as each provider's
documentation specifies and signed with keys this test generates; real PostgreSQL and Redis.

Every refusal test first sends the same report properly signed elsewhere or proves the row
unchanged, so a refusal cannot pass by the endpoint being down.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import json
import time
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
import redis
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding
from sqlalchemy import Engine, text

from notifier import metrics
from notifier.campaigns import Campaigns
from notifier.delivery.dispatcher import Dispatcher
from notifier.providers import registry_of
from notifier.providers.email import EmailProvider
from notifier.settings import Settings, get_settings
from tests.events_endpoint import (
    MAILGUN_KEY,
    POSTMARK_AUTH,
    PUBLIC,
    SECRET,
    TOPIC,
    TWILIO_TOKEN,
    Endpoint,
)
from tests.factories import MakeRow, MakeRows, SetEnv
from tests.prometheus import samples, scrape
from tests.smtp_sink import SmtpSink

#: A row its provider accepted, on the first attempt: what a delivery event is about.
SENT = {"subject": "hi", "status": "sent", "attempts": 1}


def sql(engine: Engine, statement: str, **params: object) -> list[tuple[Any, ...]]:
    with engine.begin() as conn:
        result = conn.execute(text(statement), params)
        return [tuple(row) for row in result.all()] if result.returns_rows else []


def delivery(engine: Engine, row_id: int) -> tuple[Any, ...]:
    [row] = sql(
        engine, "SELECT delivery_status, delivery_detail FROM notifications WHERE id = :i", i=row_id
    )
    return row


def attempts(engine: Engine, row_id: int) -> list[tuple[Any, ...]]:
    return sql(
        engine,
        "SELECT outcome, provider FROM notification_attempts WHERE notification_id = :i"
        " ORDER BY id",
        i=row_id,
    )


def suppressions(engine: Engine) -> list[tuple[Any, ...]]:
    return sql(engine, "SELECT channel, recipient, reason FROM suppressions ORDER BY recipient")


def refused(redis_url: str, provider: str) -> int:
    client = redis.Redis.from_url(redis_url)
    try:
        return int(client.hget("notifier:metrics:events", f"{provider}|refused") or 0)
    finally:
        client.close()


# --- Amazon SES through SNS ---------------------------------------------------------------------


def sns_signed(ep: Endpoint, doc: dict[str, str], version: str = "2") -> dict[str, str]:
    """``doc`` signed as SNS signs: "key\\nvalue\\n" for the type's keys, in AWS's order."""
    if doc["Type"] == "Notification":
        keys = ["Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"]
    else:
        keys = ["Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"]
    canonical = "".join(f"{k}\n{doc[k]}\n" for k in keys if k in doc).encode()
    algorithm = hashes.SHA1() if version == "1" else hashes.SHA256()
    signature = ep.sns_key.sign(canonical, padding.PKCS1v15(), algorithm)
    return {
        **doc,
        "SignatureVersion": version,
        "Signature": base64.b64encode(signature).decode(),
        "SigningCertURL": ep.cert_base + "/cert.pem",
    }


def ses_bounce(row_id: int, recipient: str, kind: str = "Permanent") -> dict[str, str]:
    message = {
        "notificationType": "Bounce",
        "bounce": {
            "bounceType": kind,
            "bounceSubType": "General",
            "bouncedRecipients": [
                {"emailAddress": recipient, "diagnosticCode": "smtp; 550 5.1.1 user unknown"}
            ],
            "timestamp": "2026-12-01T10:00:00.000Z",
        },
        "mail": {
            "messageId": "0100018c-ses-id",
            "headers": [{"name": "X-Notifier-Id", "value": str(row_id)}],
            "commonHeaders": {"messageId": f"<notification-{row_id}@example.com>"},
        },
    }
    return {
        "Type": "Notification",
        "MessageId": "22b80b92-fdea-4c2c-8f9d-bdfb0c7bf324",
        "TopicArn": TOPIC,
        "Message": json.dumps(message),
        "Timestamp": "2026-12-01T10:00:01.000Z",
    }


@pytest.mark.parametrize("version", ["1", "2"])
def test_ses_through_sns_confirms_and_applies_verified_reports(
    endpoint: Endpoint, engine: Engine, make_row: MakeRow, version: str
) -> None:
    confirm = {
        "Type": "SubscriptionConfirmation",
        "MessageId": "165545c9-2a5c-472c-8df2-7ff2be2b3b1b",
        "Token": "2336412f37",
        "TopicArn": TOPIC,
        "Message": "You have chosen to subscribe to the topic.",
        "SubscribeURL": endpoint.cert_base + "/confirm?Token=2336412f37",
        "Timestamp": "2026-12-01T09:00:00.000Z",
    }
    assert (
        endpoint.post(
            "/ses", json.dumps(sns_signed(endpoint, confirm, version)).encode()
        ).status_code
        == 200
    )
    assert endpoint.certs.confirmed == ["/confirm?Token=2336412f37"]

    row = make_row(**SENT, channel="email", recipient="Ann@Example.com")
    doc = sns_signed(endpoint, ses_bounce(row, "Ann@Example.com"), version)
    assert (
        endpoint.post(
            "/ses",
            json.dumps(
                {**doc, "Message": doc["Message"].replace("Permanent", "Transient")}
            ).encode(),
        ).status_code
        == 403
    )
    assert (
        endpoint.post("/ses", json.dumps({**doc, "TopicArn": TOPIC + "x"}).encode()).status_code
        == 403
    )
    elsewhere = {**doc, "SigningCertURL": "https://evil.example/cert.pem"}
    assert endpoint.post("/ses", json.dumps(elsewhere).encode()).status_code == 403
    assert delivery(engine, row) == (None, None)
    assert suppressions(engine) == []

    assert endpoint.post("/ses", json.dumps(doc).encode()).status_code == 200
    assert delivery(engine, row)[0] == "bounced"
    assert attempts(engine, row) == [("bounced", "ses")]
    [(channel, recipient, reason)] = suppressions(engine)
    assert (channel, recipient) == ("email", "ann@example.com")
    assert reason.startswith("hard bounce (ses: hard bounce Permanent/General")


# --- SendGrid -----------------------------------------------------------------------------------


def sendgrid_post(
    ep: Endpoint, events: list[dict[str, Any]], *, stamp: int | None = None, tamper: bool = False
) -> httpx.Response:
    body = json.dumps(events).encode()
    ts = str(stamp if stamp is not None else int(time.time()))
    signature = ep.sendgrid_key.sign(ts.encode() + body, ec.ECDSA(hashes.SHA256()))
    if tamper:
        body = body.replace(b"bounce", b"delivered")
    return ep.post(
        "/sendgrid",
        body,
        **{
            "Content-Type": "application/json",
            "X-Twilio-Email-Event-Webhook-Signature": base64.b64encode(signature).decode(),
            "X-Twilio-Email-Event-Webhook-Timestamp": ts,
        },
    )


def sg(row_id: int, event: str, at: int, **more: Any) -> dict[str, Any]:
    return {
        "email": f"r{row_id}@example.com",
        "timestamp": at,
        "event": event,
        "sg_event_id": f"ev-{row_id}-{event}-{at}",
        "sg_message_id": f"sg-{row_id}",
        "notifier_id": str(row_id),
        **more,
    }


def test_sendgrid_refuses_tampered_stale_and_foreign_signatures(
    endpoint: Endpoint, engine: Engine, make_row: MakeRow, redis_url: str
) -> None:
    row = make_row(**SENT, channel="email", recipient="placeholder@example.com")
    sql(
        engine,
        "UPDATE notifications SET recipient = :r WHERE id = :i",
        r=f"r{row}@example.com",
        i=row,
    )
    bounce = [sg(row, "bounce", 1_700_000_000, type="bounce", reason="550 5.1.1 unknown")]
    assert sendgrid_post(endpoint, bounce, tamper=True).status_code == 403
    assert sendgrid_post(endpoint, bounce, stamp=int(time.time()) - 3600).status_code == 403
    other = ec.generate_private_key(ec.SECP256R1())
    real, endpoint.sendgrid_key = endpoint.sendgrid_key, other
    assert sendgrid_post(endpoint, bounce).status_code == 403
    endpoint.sendgrid_key = real
    unsigned = endpoint.post("/sendgrid", json.dumps(bounce).encode())
    assert unsigned.status_code == 401
    assert delivery(engine, row) == (None, None)
    assert refused(redis_url, "sendgrid") == 4

    assert sendgrid_post(endpoint, bounce).status_code == 200
    assert delivery(engine, row)[0] == "bounced"
    assert suppressions(engine) == [
        ("email", f"r{row}@example.com", "hard bounce (sendgrid: 550 5.1.1 unknown)")
    ]


def test_late_duplicate_and_out_of_order_reports_end_in_the_right_state(
    endpoint: Endpoint, engine: Engine, make_row: MakeRow
) -> None:
    row = make_row(**SENT, channel="email", recipient="placeholder@example.com")
    sql(
        engine,
        "UPDATE notifications SET recipient = :r WHERE id = :i",
        r=f"r{row}@example.com",
        i=row,
    )
    t = 1_700_000_000
    bounce = sg(row, "bounce", t + 60, type="blocked", reason="421 try later")
    assert sendgrid_post(endpoint, [bounce, bounce]).status_code == 200  # twice in one batch
    assert sendgrid_post(endpoint, [sg(row, "delivered", t)]).status_code == 200  # earlier, late
    assert delivery(engine, row) == ("bounced", "soft bounce: 421 try later")
    assert sendgrid_post(endpoint, [bounce]).status_code == 200  # once more, later
    assert attempts(engine, row) == [("bounced", "sendgrid"), ("delivered", "sendgrid")]
    assert sendgrid_post(endpoint, [sg(row, "spamreport", t + 120)]).status_code == 200
    assert sendgrid_post(endpoint, [sg(row, "bounce", t + 90, type="bounce")]).status_code == 200
    assert delivery(engine, row)[0] == "complained"
    [(_, recipient, reason)] = suppressions(engine)
    assert (recipient, reason) == (f"r{row}@example.com", "complaint (sendgrid spamreport)")


def test_soft_bounces_suppress_only_once_enough_fall_in_the_window(
    endpoint: Endpoint, engine: Engine, make_row: MakeRow
) -> None:
    rows = [make_row(**SENT, channel="email", recipient="soft@example.com") for _ in range(3)]
    t = int(time.time())
    for n, row in enumerate(rows):
        event = {
            **sg(row, "bounce", t + n, type="blocked", reason="452 mailbox full"),
            "email": "soft@example.com",
        }
        assert sendgrid_post(endpoint, [event, event]).status_code == 200
        assert len(suppressions(engine)) == (1 if n == 2 else 0)
    [(_, recipient, reason)] = suppressions(engine)
    assert recipient == "soft@example.com"
    assert reason.startswith("soft bounces: 3 within 168h")


# --- Mailgun ------------------------------------------------------------------------------------


def mailgun_body(
    row_id: int, *, stamp: int | None = None, token: str = "tok-1", key: str = MAILGUN_KEY
) -> bytes:
    ts = str(stamp if stamp is not None else int(time.time()))
    signature = hmac.new(key.encode(), (ts + token).encode(), hashlib.sha256).hexdigest()
    return json.dumps(
        {
            "signature": {"timestamp": ts, "token": token, "signature": signature},
            "event-data": {
                "event": "delivered",
                "id": "CPgfbmQMTCKtHW6uIWtuVe",
                "timestamp": 1_700_000_000.25,
                "recipient": "mg@example.com",
                "user-variables": {"notifier_id": str(row_id)},
                "message": {"headers": {"message-id": f"notification-{row_id}@example.com"}},
                "delivery-status": {"code": 250, "message": "OK"},
            },
        }
    ).encode()


def test_mailgun_refuses_wrong_keys_old_timestamps_and_replayed_tokens(
    endpoint: Endpoint, engine: Engine, make_row: MakeRow
) -> None:
    row = make_row(**SENT, channel="email", recipient="mg@example.com")
    assert endpoint.post("/mailgun", mailgun_body(row, key="wrong")).status_code == 403
    assert (
        endpoint.post(
            "/mailgun", mailgun_body(row, stamp=int(time.time()) - 3600, token="old")
        ).status_code
        == 403
    )
    assert delivery(engine, row) == (None, None)
    assert endpoint.post("/mailgun", mailgun_body(row)).status_code == 200
    assert delivery(engine, row) == ("delivered", "250 OK")
    sql(
        engine,
        "UPDATE notifications SET delivery_status = NULL, delivery_at = NULL WHERE id = :i",
        i=row,
    )
    assert endpoint.post("/mailgun", mailgun_body(row)).status_code == 403  # the same token again
    assert delivery(engine, row) == (None, "250 OK")


# --- Postmark -----------------------------------------------------------------------------------


def postmark_complaint(row: int) -> bytes:
    return json.dumps(
        {
            "RecordType": "SpamComplaint",
            "MessageID": "00000000-0000-0000-0000-000000000000",
            "Email": "pm@example.com",
            "BouncedAt": "2026-12-01T10:00:00Z",
            "Metadata": {"notifier-id": str(row)},
        }
    ).encode()


def test_postmark_needs_the_url_credentials(
    endpoint: Endpoint, engine: Engine, make_row: MakeRow
) -> None:
    row = make_row(**SENT, channel="email", recipient="pm@example.com")
    body = postmark_complaint(row)
    assert endpoint.post("/postmark", body).status_code == 401
    wrong = base64.b64encode(b"postmark:guess").decode()
    assert endpoint.post("/postmark", body, Authorization=f"Basic {wrong}").status_code == 403
    assert delivery(engine, row) == (None, None)
    right = base64.b64encode(POSTMARK_AUTH.encode()).decode()
    assert endpoint.post("/postmark", body, Authorization=f"Basic {right}").status_code == 200
    assert delivery(engine, row) == ("complained", "complaint: SpamComplaint")
    assert suppressions(engine) == [
        ("email", "pm@example.com", "complaint (postmark SpamComplaint)")
    ]


# --- Twilio -------------------------------------------------------------------------------------


def twilio_post(ep: Endpoint, params: dict[str, str], token: str = TWILIO_TOKEN) -> httpx.Response:
    """Signed as Twilio signs: the full URL, then each parameter's name and value, sorted."""
    data = PUBLIC + "/twilio" + "".join(k + params[k] for k in sorted(params))
    signature = base64.b64encode(hmac.new(token.encode(), data.encode(), hashlib.sha1).digest())
    return ep.post(
        "/twilio",
        urlencode(params).encode(),
        **{
            "Content-Type": "application/x-www-form-urlencoded",
            "X-Twilio-Signature": signature.decode(),
        },
    )


def test_twilio_callbacks_apply_opt_outs_and_refuse_bad_signatures(
    endpoint: Endpoint, engine: Engine, make_row: MakeRow
) -> None:
    row = make_row(
        **SENT,
        channel="sms",
        recipient="+14155550100",
        provider_message_id="SM0123456789abcdef0123456789abcdef",
    )
    status = {
        "MessageSid": "SM0123456789abcdef0123456789abcdef",
        "MessageStatus": "undelivered",
        "ErrorCode": "21610",
        "To": "+14155550100",
        "From": "+14155550199",
        "AccountSid": "AC0123456789abcdef0123456789abcdef",
    }
    assert twilio_post(endpoint, status, token="not-the-token").status_code == 403
    assert delivery(engine, row) == (None, None)
    assert twilio_post(endpoint, status).status_code == 200
    assert delivery(engine, row) == ("undelivered", "undelivered (error 21610)")
    inbound = {
        "MessageSid": "SMinbound",
        "From": "+14155550111",
        "To": "+14155550199",
        "Body": " stop ",
    }
    assert twilio_post(endpoint, inbound).status_code == 200
    assert suppressions(engine) == [
        ("sms", "+14155550100", "sms opt-out (twilio error 21610)"),
        ("sms", "+14155550111", "sms opt-out (replied STOP)"),
    ]


# --- one-click unsubscribe ----------------------------------------------------------------------


def test_a_campaign_email_unsubscribes_its_recipient_from_marketing_in_one_click(
    endpoint: Endpoint,
    engine: Engine,
    make_rows: MakeRows,
    settings: Settings,
    smtp_sink: SmtpSink,
    set_env: SetEnv,
) -> None:
    set_env(events_public_url=endpoint.url, unsubscribe_secret=SECRET)
    campaigns = Campaigns(engine)
    campaigns.create("spring", "email", subject="A gift", body="Your code: {code}")
    audience = io.StringIO("email\nAnn@example.com\nbob@example.com\n")
    assert campaigns.import_audience("spring", audience, "email") == 2
    campaigns.generate_codes("spring", 2)
    campaigns.launch("spring")

    def dispatch() -> None:
        dispatcher = Dispatcher(engine, registry_of([EmailProvider(get_settings())]), settings)
        try:
            dispatcher.run_once()
        finally:
            dispatcher.close()

    dispatch()
    links = {}
    for received in smtp_sink.messages:
        message = received.message
        assert message["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
        link = str(message["List-Unsubscribe"])
        assert link.startswith(f"<{endpoint.url}/u/")
        assert link.endswith(">")
        links[received.rcpt_tos[0]] = link[1:-1]
    assert set(links) == {"Ann@example.com", "bob@example.com"}

    page = endpoint.client.get(links["Ann@example.com"])
    assert page.status_code == 200
    assert '<form method="post">' in page.text
    assert endpoint.client.head(links["Ann@example.com"]).status_code == 200
    assert endpoint.client.post(links["Ann@example.com"]).status_code == 400  # no form
    assert suppressions(engine) == []  # neither a GET, a HEAD nor an empty POST unsubscribes

    one_click = endpoint.client.post(
        links["Ann@example.com"],
        content=b"List-Unsubscribe=One-Click",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert one_click.status_code == 200
    assert suppressions(engine) == []  # not every category: marketing only
    assert sql(engine, "SELECT channel, recipient, category, reason FROM category_opt_outs") == [
        ("email", "ann@example.com", "marketing", "unsubscribed (one-click, marketing)")
    ]

    # Ann's password reset (transactional) still reaches her; more marketing does not.
    make_rows(
        3,
        channel="email",
        recipient=lambda i: ["ann@example.com", "Ann@example.com", "bob@example.com"][i - 1],
        subject=lambda i: ["password reset", "again", "again"][i - 1],
        category=lambda i: [None, "marketing", "marketing"][i - 1],
        body="x",
    )
    dispatch()
    assert sql(
        engine,
        "SELECT recipient, subject, status, last_error FROM notifications"
        " WHERE campaign_id IS NULL ORDER BY id",
    ) == [
        ("ann@example.com", "password reset", "sent", None),
        (
            "Ann@example.com",
            "again",
            "cancelled",
            "suppressed: unsubscribed (one-click, marketing)",
        ),
        ("bob@example.com", "again", "sent", None),
    ]


# --- metrics ------------------------------------------------------------------------------------


def test_refusals_and_acceptances_are_served_by_notifier_metrics(
    endpoint: Endpoint, engine: Engine, redis_url: str, make_row: MakeRow
) -> None:
    row = make_row(**SENT, channel="email", recipient="pm@example.com")
    body = postmark_complaint(row)
    assert endpoint.post("/postmark", body).status_code == 401
    assert refused(redis_url, "postmark") == 1  # refused, and counted by the endpoint
    right = base64.b64encode(POSTMARK_AUTH.encode()).decode()
    for _ in range(2):  # applied, then the same report again: unchanged
        assert endpoint.post("/postmark", body, Authorization=f"Basic {right}").status_code == 200
    client = redis.Redis.from_url(redis_url)
    client.hincrby(metrics.EVENTS_KEY, "pigeon|refused", 2)  # a route this version lacks
    client.hincrby(metrics.EVENTS_KEY, "postmark|lost", 3)  # an outcome it does not know
    client.hincrby(metrics.EVENTS_KEY, "not a field", 4)

    found = samples(scrape(engine, client, metrics.Labels(frozenset(), frozenset())))
    client.close()

    events = {k: v for k, v in found.items() if k[0] == "notifier_events_total"}
    assert events == {
        ("notifier_events_total", (("outcome", "refused"), ("provider", "postmark"))): 1,
        ("notifier_events_total", (("outcome", "applied"), ("provider", "postmark"))): 1,
        ("notifier_events_total", (("outcome", "unchanged"), ("provider", "postmark"))): 1,
        ("notifier_events_total", (("outcome", "other"), ("provider", "postmark"))): 3,
        ("notifier_events_total", (("outcome", "refused"), ("provider", "other"))): 2,
    }
