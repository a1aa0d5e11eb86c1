"""Email through a real relay: Debian's Postfix on loopback, STARTTLS with the test's own CA.

Rows go into ``notifications``; a worker and beat send them with the ``email`` provider to a
private Postfix (``tests.postfix_server``), which delivers them to Maildirs; the messages are
read back from there, as a mail client would find them. Nothing here depends on how the
provider talks SMTP, only on rows in and mail out.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from email import message_from_bytes, policy
from email.message import EmailMessage, MIMEPart

import pytest
from sqlalchemy import Engine, text

from notifier import unsubscribe
from tests.acceptance.conftest import Services, unfinished, wait_for
from tests.factories import MakeRow
from tests.postfix_server import DOMAIN, PostfixServer, missing

SENDER = "Shöp Ünïcode <noreply@shop.example>"
SECRET = "unsubscribe-secret-for-the-relay-test"
PUBLIC = "https://events.example.test"
MAILTO = "unsub@shop.example"
BOXES = ("ada", "bob", "chen")


def address(box: str) -> str:
    return f"{box}@{DOMAIN}"


@pytest.fixture
def postfix() -> Iterator[PostfixServer]:
    reason = missing()
    if reason is not None:
        pytest.skip(f"no private Postfix here: {reason}")
    server = PostfixServer(BOXES)
    try:
        yield server.start()
    finally:
        server.close()  # fails the test if a process of the instance outlives postfix stop


@pytest.fixture
def relay(postfix: PostfixServer, services: Services) -> Services:
    """Worker and beat send email through ``postfix`` over STARTTLS, trusting its CA only."""
    services.env.update(
        NOTIFIER_SMTP_HOST=postfix.host,
        NOTIFIER_SMTP_PORT=str(postfix.port),
        NOTIFIER_SMTP_TLS="starttls",
        NOTIFIER_SMTP_CA_FILE=str(postfix.ca),
        NOTIFIER_EMAIL_FROM=SENDER,
        NOTIFIER_EVENTS_PUBLIC_URL=PUBLIC,
        NOTIFIER_UNSUBSCRIBE_SECRET=SECRET,
        NOTIFIER_UNSUBSCRIBE_MAILTO=MAILTO,
    )
    return services


def _outcomes(engine: Engine) -> dict[int, tuple[str, int, str | None, str | None]]:
    """Every row's status, attempts, provider message id and last error, by id."""
    with engine.connect() as conn:
        found = conn.execute(
            text("SELECT id, status, attempts, provider_message_id, last_error FROM notifications")
        )
        return {row_id: (status, n, sent_id, error) for row_id, status, n, sent_id, error in found}


def _delivered(postfix: PostfixServer) -> dict[str, list[bytes]]:
    return {box: postfix.delivered(box) for box in BOXES}


def _wait_for_delivery(postfix: PostfixServer, at_least: int) -> None:
    """Until Postfix delivered ``at_least`` messages and holds none in its queue: then every
    message it accepted (the rows are finished only once it did) is in a mailbox, copies too."""
    wait_for(
        lambda: sum(map(len, _delivered(postfix).values())) >= at_least and not postfix.queued(),
        60,
        f"Postfix to deliver {at_least} messages and empty its queue",
    )


def _parse(raw: bytes) -> EmailMessage:
    parsed = message_from_bytes(raw, policy=policy.default)
    assert isinstance(parsed, EmailMessage)
    return parsed


def _text(part: MIMEPart | None) -> str:
    """A text part's content with its lines ended in LF, as the row wrote them: notifier sends a
    text part in MIME's canonical form, lines ended in CRLF (RFC 2046 section 4.1.1)."""
    assert part is not None
    content = part.get_content()
    assert isinstance(content, str)
    return content.replace("\r\n", "\n")


def campaign(i: int) -> dict[str, object]:
    """Row ``i`` of a promotion: non-Latin text in every field, HTML, an unsubscribe link."""
    return {
        "channel": "email",
        "recipient": address(BOXES[i % len(BOXES)]),
        "subject": f"Grüße №{i} — скидка 東京 ✓ 🎉",
        "body": f"Привет, {i}!\nこんにちは — ½ off 🌍\nالعربية\n",  # noqa: RUF001 - Arabic, meant
        "payload": {
            "html": f"<p>Привет, <b>{i}</b>!</p>\n<p>東京 — ½ off 🌍</p>\n",
            "unsubscribe": True,
            "headers": {"X-Campaign": "весна-2025"},
        },
        "category": "marketing",
    }


def test_messages_arrive_once_each_over_starttls_with_their_headers_and_parts(
    engine: Engine, make_row: MakeRow, postfix: PostfixServer, relay: Services
) -> None:
    promo = {make_row(**campaign(i)): campaign(i) for i in range(1, 10)}
    receipt = make_row(
        channel="email", recipient=address("bob"), subject="Your receipt", body="Total: 12 €\n"
    )
    relay.worker()
    relay.beat()
    wait_for(lambda: unfinished(engine) == 0, 60, "every row to be finished")
    _wait_for_delivery(postfix, len(promo) + 1)

    # The sends went over TLS: Postfix says so in its log and in the Received header.
    log = postfix.log()
    assert "TLS connection established from" in log, log[-3000:]
    delivered = _delivered(postfix)
    raws = [raw for box in BOXES for raw in delivered[box]]
    messages = [_parse(raw) for raw in raws]
    for message in messages:
        received = str(message["Received"])
        assert re.search(r"\(using TLSv1\.[23] with cipher", received), received
        assert "with ESMTPS" in received

    # Exactly one copy of each row, in the right mailbox.
    rows = _outcomes(engine)
    assert {row_id: row[:2] for row_id, row in rows.items()} == {
        row_id: ("sent", 1) for row_id in [*promo, receipt]
    }
    by_id = Counter(str(m["X-Notifier-Id"]) for m in messages)
    assert by_id == Counter({str(row_id): 1 for row_id in rows})
    by_message_id = Counter(str(m["Message-ID"]) for m in messages)
    assert by_message_id == Counter({f"<notification-{row_id}@shop.example>": 1 for row_id in rows})
    assert all(rows[row_id][2] == f"<notification-{row_id}@shop.example>" for row_id in rows)
    found = {
        int(str(m["X-Notifier-Id"])): (box, m) for box in BOXES for m in map(_parse, delivered[box])
    }
    assert {row_id: box for row_id, (box, _) in found.items()} == {
        **{row_id: str(row["recipient"]).partition("@")[0] for row_id, row in promo.items()},
        receipt: "bob",
    }

    for row_id, row in promo.items():
        _, message = found[row_id]
        payload = row["payload"]
        assert isinstance(payload, dict)
        # Headers, non-ASCII ones encoded for the wire (RFC 2047) and decoded back as written.
        assert message["From"].addresses[0].display_name == "Shöp Ünïcode"
        assert message["From"].addresses[0].addr_spec == "noreply@shop.example"
        assert str(message["To"]) == row["recipient"]
        assert str(message["Subject"]) == row["subject"]
        assert str(message["X-Campaign"]) == "весна-2025"
        assert json.loads(str(message["X-Mailgun-Variables"])) == {"notifier_id": str(row_id)}
        assert json.loads(str(message["X-SMTPAPI"])) == {
            "unique_args": {"notifier_id": str(row_id)}
        }
        assert str(message["X-PM-Metadata-notifier-id"]) == str(row_id)
        # One-click unsubscribe (RFC 8058): a link and a mailto, both naming this row's opt-out.
        assert str(message["List-Unsubscribe-Post"]) == "List-Unsubscribe=One-Click"
        link, mailto = str(message["List-Unsubscribe"]).split(", ")
        token = re.fullmatch(rf"<{re.escape(PUBLIC)}/u/([A-Za-z0-9_-]+)>", link)
        assert token is not None, link
        assert mailto == f"<mailto:{MAILTO}?subject=unsubscribe%20{token[1]}>"
        assert unsubscribe.read_token(SECRET, token[1]) == unsubscribe.Subscription(
            "email", str(row["recipient"]), "marketing"
        )
        # multipart/alternative: the UTF-8 text and the HTML, each decoded as sent.
        assert message.get_content_type() == "multipart/alternative"
        plain, html = message.get_body(("plain",)), message.get_body(("html",))
        assert plain is not None
        assert html is not None
        assert plain.get_content_charset() == html.get_content_charset() == "utf-8"
        assert _text(plain) == row["body"]
        assert _text(html) == payload["html"]

    # Every header line on the wire is ASCII: notifier encodes, it does not need SMTPUTF8.
    for raw in raws:
        head = raw.split(b"\n\n", 1)[0]
        assert head.isascii(), head

    # A transactional row: no unsubscribe link, a single text part.
    _, message = found[receipt]
    assert message["List-Unsubscribe"] is None
    assert message.get_content_type() == "text/plain"
    assert _text(message) == "Total: 12 €\n"


def test_a_mailbox_postfix_refuses_at_rcpt_is_dead_and_suppressed(
    engine: Engine, make_row: MakeRow, postfix: PostfixServer, relay: Services
) -> None:
    gone = make_row(channel="email", recipient=address("nobody"), subject="Hello", body="Hi\n")
    kept = make_row(channel="email", recipient=address("ada"), subject="Hello", body="Hi\n")
    relay.worker()
    relay.beat()
    wait_for(lambda: unfinished(engine) == 0, 60, "both rows to be finished")
    _wait_for_delivery(postfix, 1)

    # Postfix refused the mailbox itself, at RCPT TO, after STARTTLS.
    log = postfix.log()
    assert re.search(
        rf"NOQUEUE: reject: RCPT from .*: 550 5\.1\.1 <nobody@{DOMAIN}>: Recipient address"
        r" rejected: User unknown in virtual mailbox table",
        log,
    ), log[-3000:]
    assert "TLS connection established from" in log
    ended = _outcomes(engine)
    with engine.connect() as conn:
        suppressed = conn.execute(text("SELECT channel, recipient FROM suppressions")).all()
    status, attempts, _, error = ended[gone]
    assert (status, attempts) == ("dead", 1)
    assert str(error).startswith(f"SMTP 550 5.1.1 <nobody@{DOMAIN}>: Recipient address rejected")
    assert ended[kept][:2] == ("sent", 1)
    assert [tuple(row) for row in suppressed] == [("email", address("nobody"))]
    assert len(postfix.delivered("ada")) == 1
