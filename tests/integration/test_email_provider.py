"""The email provider against real servers on loopback: the controllable SMTP sink, a closed port,
and a server that accepts connections and never says a word."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import pytest

from notifier.models import Notification
from notifier.providers.base import InvalidNotification, Permanent, Retry, Sent
from notifier.providers.email import EmailProvider
from notifier.settings import get_settings
from tests.factories import SetEnv
from tests.smtp_sink import SmtpSink

ADA = "ada@example.com"


def note(
    id: int = 1,
    recipient: str = ADA,
    subject: str | None = "Your order shipped",
    body: str | None = "It is on its way.",
    payload: dict[str, Any] | None = None,
) -> Notification:
    return Notification(
        id=id,
        channel="email",
        recipient=recipient,
        subject=subject,
        body=body,
        payload=payload or {},
        attempts=1,
        max_attempts=5,
        claim_token=uuid4(),
        created_at=datetime.now(UTC),
    )


@pytest.fixture
def provider(smtp_sink: SmtpSink, set_env: SetEnv) -> Iterator[EmailProvider]:
    set_env(email_from="Shop <noreply@shop.example>")
    p = EmailProvider(get_settings())
    yield p
    p.close()


def with_header(name: str, value: str) -> dict[str, Any]:
    return {"payload": {"headers": {name: value}}}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


# -- delivery --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("subject", "body", "payload", "expect"),
    [
        pytest.param("Hi", "plain", {}, {"text": "plain"}, id="plain"),
        pytest.param(None, None, {}, {"text": "", "subject": ""}, id="no-subject-no-body"),
        pytest.param(
            "Grüße ✓",
            "Hé, ça marche",
            {},
            {"text": "Hé, ça marche", "subject": "Grüße ✓"},
            id="non-ascii",
        ),
        pytest.param(
            "Hi",
            "plain",
            {"html": "<p>rich</p>"},
            {"text": "plain", "html": "<p>rich</p>"},
            id="html",
        ),
        pytest.param(
            "Hi",
            "plain",
            {"headers": {"X-Campaign": "spring", "Reply-To": "help@shop.example"}},
            {"text": "plain", "headers": {"X-Campaign": "spring", "Reply-To": "help@shop.example"}},
            id="extra-headers",
        ),
    ],
)
def test_sends_one_message(
    smtp_sink: SmtpSink,
    provider: EmailProvider,
    subject: str | None,
    body: str | None,
    payload: dict[str, Any],
    expect: dict[str, Any],
) -> None:
    outcome = provider.send(note(id=7, subject=subject, body=body, payload=payload))

    assert outcome == Sent("<notification-7@shop.example>")
    [received] = smtp_sink.messages
    msg = received.message
    assert received.mail_from == "noreply@shop.example"
    assert received.rcpt_tos == [ADA]
    assert received.message_id == outcome.provider_message_id
    assert msg["From"] == "Shop <noreply@shop.example>"
    assert msg["To"] == ADA
    assert msg["Subject"] == expect.get("subject", subject)
    assert msg["Date"] is not None
    text = msg.get_body(("plain",))
    assert text is not None
    assert text.get_content().rstrip("\r\n") == expect["text"]
    html = msg.get_body(("html",))
    if "html" in expect:
        assert msg.get_content_type() == "multipart/alternative"
        assert html is not None
        assert html.get_content().rstrip("\r\n") == expect["html"]
    else:
        assert html is None
    for name, value in expect.get("headers", {}).items():
        assert msg[name] == value


def test_message_id_is_the_same_on_every_attempt(
    smtp_sink: SmtpSink, provider: EmailProvider
) -> None:
    first = provider.send(note(id=42))
    second = provider.send(note(id=42))  # a retry of the same row

    assert first == second == Sent("<notification-42@shop.example>")
    assert [m.message_id for m in smtp_sink.messages] == ["<notification-42@shop.example>"] * 2


def test_message_id_domain_falls_back_when_email_from_has_none(
    smtp_sink: SmtpSink, set_env: SetEnv
) -> None:
    set_env(email_from="notifier")
    provider = EmailProvider(get_settings())
    try:
        outcome = provider.send(note(id=3))
    finally:
        provider.close()

    assert outcome == Sent("<notification-3@notifier.localhost>")
    assert smtp_sink.messages[0].message_id == "<notification-3@notifier.localhost>"


# -- refusals --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rcpt_reply", "data_reply", "expected"),
    [
        pytest.param(
            "550 5.1.1 no such user",
            None,
            Permanent("SMTP 550 5.1.1 no such user", suppress=True),
            id="rcpt-550",
        ),
        pytest.param("451 4.3.0 try later", None, Retry("SMTP 451 4.3.0 try later"), id="rcpt-451"),
        pytest.param(
            None,
            "554 5.7.1 looks like spam",
            Permanent("SMTP 554 5.7.1 looks like spam"),
            id="data-554",
        ),
        pytest.param(
            None, "452 4.3.1 mailbox full", Retry("SMTP 452 4.3.1 mailbox full"), id="data-452"
        ),
    ],
)
def test_refusal_is_classified_by_reply_code_and_the_connection_is_kept(
    smtp_sink: SmtpSink,
    provider: EmailProvider,
    rcpt_reply: str | None,
    data_reply: str | None,
    expected: Retry | Permanent,
) -> None:
    if rcpt_reply is not None:
        smtp_sink.rcpt_replies[ADA] = rcpt_reply
    smtp_sink.data_reply = data_reply

    assert provider.send(note(id=1)) == expected
    assert smtp_sink.rcpt_addresses() == [ADA]  # the server was asked, and refused
    assert smtp_sink.messages == []

    # After RSET the same connection carries the next message.
    smtp_sink.rcpt_replies.clear()
    smtp_sink.data_reply = None
    assert provider.send(note(id=2)) == Sent("<notification-2@shop.example>")
    assert len(smtp_sink.messages) == 1
    assert smtp_sink.connections == 1


# -- network faults and misconfiguration -----------------------------------------------------------


def test_closed_port_is_retried(set_env: SetEnv) -> None:
    port = closed_port()
    set_env(smtp_host="127.0.0.1", smtp_port=port)
    provider = EmailProvider(get_settings())
    try:
        outcome = provider.send(note())
    finally:
        provider.close()

    assert isinstance(outcome, Retry)
    assert f"127.0.0.1:{port}" in outcome.error
    assert "refused" in outcome.error.lower()


@pytest.fixture
def silent_server() -> Iterator[tuple[int, list[socket.socket]]]:
    """Accepts connections and never answers: the SMTP greeting never comes."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    accepted: list[socket.socket] = []
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            accepted.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1], accepted
    done.set()
    thread.join(timeout=5)
    for conn in accepted:
        conn.close()
    listener.close()


def test_silent_server_times_out_and_is_retried(
    silent_server: tuple[int, list[socket.socket]], set_env: SetEnv
) -> None:
    port, accepted = silent_server
    set_env(smtp_host="127.0.0.1", smtp_port=port, smtp_timeout=1)
    provider = EmailProvider(get_settings())
    started = time.monotonic()
    try:
        outcome = provider.send(note())
    finally:
        provider.close()
    elapsed = time.monotonic() - started

    assert len(accepted) == 1  # the server really held a connection open
    assert outcome == Retry(f"SMTP timeout after 1s talking to 127.0.0.1:{port}")
    assert elapsed < 5


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param({"smtp_username": "shop"}, "AUTH extension not supported", id="auth"),
        pytest.param({"smtp_tls": "starttls"}, "STARTTLS extension not supported", id="starttls"),
    ],
)
def test_misconfiguration_is_retried_with_the_servers_reason(
    smtp_sink: SmtpSink, set_env: SetEnv, env: dict[str, str], expected: str
) -> None:
    set_env(**env)
    provider = EmailProvider(get_settings())
    try:
        outcome = provider.send(note())
    finally:
        provider.close()

    assert isinstance(outcome, Retry)
    assert expected in outcome.error
    assert f"{smtp_sink.host}:{smtp_sink.port}" in outcome.error
    assert smtp_sink.rcpt_addresses() == []


# -- connections -----------------------------------------------------------------------------------


def test_batches_share_one_connection_until_shutdown(
    smtp_sink: SmtpSink, provider: EmailProvider
) -> None:
    outcomes = [provider.send(note(id=i)) for i in range(1, 6)]

    assert outcomes == [Sent(f"<notification-{i}@shop.example>") for i in range(1, 6)]
    assert len(smtp_sink.messages) == 5
    assert smtp_sink.connections == 1

    provider.close()  # the end of a batch: the connection stays for the next one
    assert provider.send(note(id=6)) == Sent("<notification-6@shop.example>")
    assert smtp_sink.connections == 1

    provider.shutdown()
    assert provider.send(note(id=7)) == Sent("<notification-7@shop.example>")
    assert smtp_sink.connections == 2  # shutdown() let the first connection go


@pytest.mark.parametrize(
    ("server_comes_back", "expected"),
    [
        pytest.param(True, Sent("<notification-2@shop.example>"), id="restarted"),
        pytest.param(False, None, id="gone"),
    ],
)
def test_a_pooled_connection_the_server_dropped_is_replaced_once(
    smtp_sink: SmtpSink,
    provider: EmailProvider,
    server_comes_back: bool,
    expected: Sent | None,
) -> None:
    assert provider.send(note(id=1)) == Sent("<notification-1@shop.example>")
    smtp_sink.stop()  # drops the connection the provider keeps in its pool
    if server_comes_back:
        smtp_sink.start()

    outcome = provider.send(note(id=2))

    if expected is not None:
        assert outcome == expected
        assert [m.message_id for m in smtp_sink.messages][-1] == expected.provider_message_id
        assert smtp_sink.connections == 2
    else:
        assert isinstance(outcome, Retry)
        assert "refused" in outcome.error.lower()
        assert smtp_sink.connections == 1


def test_concurrent_sends_each_arrive_exactly_once(
    smtp_sink: SmtpSink, provider: EmailProvider
) -> None:
    notes = [note(id=i, recipient=f"user{i}@example.com") for i in range(1, 21)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(provider.send, notes))
    provider.close()

    assert outcomes == [Sent(f"<notification-{n.id}@shop.example>") for n in notes]
    assert sorted(m.message_id for m in smtp_sink.messages) == sorted(
        f"<notification-{n.id}@shop.example>" for n in notes
    )
    for n in notes:
        assert len(smtp_sink.delivered_to(n.recipient)) == 1
    assert 1 <= smtp_sink.connections <= 8


# -- validation ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        pytest.param({"recipient": ""}, "recipient is empty", id="empty-recipient"),
        pytest.param({"recipient": "   "}, "recipient is empty", id="blank-recipient"),
        pytest.param({"recipient": "ada"}, "not a plain ASCII email address", id="no-at"),
        pytest.param(
            {"recipient": "ada@localhost"}, "not a plain ASCII email address", id="no-dot"
        ),
        pytest.param(
            {"recipient": "ada lovelace@example.com"},
            "not a plain ASCII email address",
            id="space",
        ),
        pytest.param(
            {"recipient": "ada@example.com, bob@example.com"},
            "one row per address",
            id="two-addresses",
        ),
        pytest.param(
            {"recipient": "Ada <ada@example.com>"}, "give the bare address", id="display-name"
        ),
        pytest.param({"recipient": "ada@exämple.com"}, "punycode", id="non-ascii-domain"),
        pytest.param({"recipient": "a" * 250 + "@example.com"}, "at most 254", id="too-long"),
        pytest.param(
            {"recipient": "ada@example.com\r\nBcc: eve@example.com"},
            "recipient contains a line break",
            id="recipient-injection",
        ),
        pytest.param(
            {"subject": "Hi\nBcc: eve@example.com"},
            "subject contains U\\+000A LINE FEED at position 2; headers cannot carry line or",
            id="subject-injection",
        ),
        *(
            pytest.param(
                {"subject": f"Hi{char}Bcc: eve@example.com"},
                f"subject contains U\\+{ord(char):04X} {name} at position 2; {why}",
                id=f"subject-U+{ord(char):04X}",
            )
            for char, name, why in [
                ("\r", "CARRIAGE RETURN", "headers cannot carry line or paragraph separators"),
                ("\x0b", "LINE TABULATION", "headers cannot carry line or paragraph separators"),
                ("\x0c", "FORM FEED", "headers cannot carry line or paragraph separators"),
                ("\x85", "NEXT LINE", "headers cannot carry line or paragraph separators"),
                ("\u2028", "LINE SEPARATOR", "headers cannot carry line or paragraph separators"),
                ("\u2029", "PARAGRAPH SEPARATOR", "headers cannot carry line or paragraph sep"),
                ("\x00", "NULL", "headers cannot carry control characters"),
                ("\x1b", "ESCAPE", "headers cannot carry control characters"),
                ("\x7f", "DELETE", "headers cannot carry control characters"),
                ("\x9b", "CONTROL", "headers cannot carry control characters"),
                ("\ud800", "SURROGATE", "a lone surrogate is not text"),
            ]
        ),
        pytest.param({"subject": "x" * 999}, "subject is 999 characters", id="subject-too-long"),
        pytest.param({"payload": {"html": 42}}, "payload.html must be a string", id="html-int"),
        pytest.param(
            {"payload": {"headers": ["X-A: b"]}},
            "payload.headers must be an object",
            id="headers-list",
        ),
        pytest.param(
            {"payload": {"headers": {"X A": "b"}}}, "invalid header name", id="header-name-space"
        ),
        pytest.param(
            {"payload": {"headers": {"X-A:": "b"}}}, "invalid header name", id="header-name-colon"
        ),
        pytest.param(
            {"payload": {"headers": {"X-A": 1}}}, "must be a one-line string", id="header-value-int"
        ),
        pytest.param(
            {"payload": {"headers": {"X-A": "b\r\nBcc: eve@example.com"}}},
            r"payload.headers\['X-A'\] contains U\+000D CARRIAGE RETURN at position 1",
            id="header-value-injection",
        ),
        *(
            pytest.param(with_header(name, value), message, id=id)
            for id, name, value, message in [
                (
                    "header-value-line-separator",
                    "X-A",
                    "b\u2028Bcc: eve@example.com",
                    r"payload.headers\['X-A'\] contains U\+2028 LINE SEPARATOR at position 1",
                ),
                ("header-name-too-long", "X-" + "a" * 63, "b", "use up to 64 printable ASCII"),
                (
                    "reply-to-not-an-address",
                    "Reply-To",
                    "help at shop",
                    r"payload.headers\['Reply-To'\] 'help at shop' is not one address",
                ),
                (
                    "reply-to-two-addresses",
                    "Reply-To",
                    "a@shop.example, b@shop.example",
                    "is not one address",
                ),
                (
                    "reply-to-long-display-name",
                    "Reply-To",
                    "Ünïcödé Sérvïcé Dèsk, Ëürøpé Nörth <h@x.example>",
                    "has a display name of 47 bytes in UTF-8; at most 42 unless",
                ),
                (
                    "reply-to-display-name-separator",
                    "Reply-To",
                    "Help\u2028Bcc: e@x.example <h@shop.example>",
                    r"payload.headers\['Reply-To'\] contains U\+2028 LINE SEPARATOR at position 4",
                ),
            ]
        ),
        *(
            pytest.param(
                {"payload": {"headers": {name: "x"}}}, "may not set", id=f"reserved-{name}"
            )
            for name in [
                "From",
                "to",
                "Subject",
                "Message-ID",
                "Date",
                "Cc",
                "BCC",
                "Content-Type",
                "MIME-Version",
            ]
        ),
        *(
            pytest.param(
                with_header(name, "x"),
                "of the address and date headers a row may set Reply-To only",
                id=f"structured-{name}",
            )
            for name in ["Sender", "Resent-To", "resent-from", "Orig-Date"]
        ),
    ],
)
def test_validate_refuses_with_a_helpful_message(
    smtp_sink: SmtpSink, provider: EmailProvider, changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidNotification, match=message):
        provider.validate(note(**changes))
    assert smtp_sink.rcpt_addresses() == []
    assert smtp_sink.connections == 0


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({}, id="typical"),
        pytest.param({"subject": None, "body": None}, id="bare"),
        pytest.param({"recipient": "first.last+tag@mail.example.co.uk"}, id="plus-and-subdomain"),
        pytest.param({"payload": {"html": None, "headers": None}}, id="nulls"),
        pytest.param({"payload": {"headers": {"List-Unsubscribe": "<mailto:u@x.io>"}}}, id="hdr"),
        pytest.param({"subject": "x" * 998}, id="longest-subject"),
        pytest.param({"subject": "Hi\tthere ✓ =?utf-8?q?x?="}, id="tab-and-encoded-word-shape"),
        pytest.param(
            with_header("Reply-To", '"Help, Desk" <help@shop.example>'), id="reply-to-display-name"
        ),
    ],
)
def test_validate_accepts(provider: EmailProvider, changes: dict[str, Any]) -> None:
    provider.validate(note(**changes))
