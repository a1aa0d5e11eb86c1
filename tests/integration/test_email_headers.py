"""Header injection through an encoded word, against a real SMTP sink and a real database.

Python before 3.11.10 / 3.12.5 decodes an encoded word written in a header value
(``=?utf-8?q?Hi=0D=0ABcc:_eve@evil.example?=``) and writes what it decoded back raw when it
folds the header, so the CR LF inside starts a header of the attacker's choosing. Whatever the
Python, the message that arrives must carry exactly the headers notifier meant, each reading
exactly as the producer wrote it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from sqlalchemy import Engine, text

from notifier.db.templates import upsert_template
from notifier.delivery.dispatcher import Dispatcher
from notifier.providers import registry_of
from notifier.providers.base import InvalidNotification, Sent
from notifier.providers.email import EmailProvider
from notifier.settings import Settings as NotifierSettings
from notifier.settings import get_settings
from tests.factories import MakeRow
from tests.integration.test_email_provider import note
from tests.smtp_sink import Received, SmtpSink
from tests.unit.test_email_message import carryable, values

ATTACK = "=?utf-8?q?Hi=0D=0ABcc:_eve@evil.example?="
#: the same attack hidden behind text, and folded over several encoded words
LONG_ATTACK = "Your order " + "=?utf-8?q?x=0D=0ABcc:_eve@evil.example?= " * 3 + "shipped"
BASE = ["From", "To", "Subject", "Date", "Message-ID"]
# What delivery reports find their row by (a row's own headers come before these).
BASE += ["X-Notifier-Id", "X-Mailgun-Variables", "X-SMTPAPI", "X-PM-Metadata-notifier-id"]
BASE += ["Content-Type", "Content-Transfer-Encoding", "MIME-Version"]


@pytest.fixture
def provider(smtp_sink: SmtpSink) -> Iterator[EmailProvider]:
    p = EmailProvider(get_settings())
    yield p
    p.close()


def header_names(received: Received) -> list[str]:
    return [name for name, _ in received.message.raw_items()]


@pytest.mark.parametrize("subject", [ATTACK, LONG_ATTACK])
def test_an_encoded_word_in_the_subject_is_sent_as_written(
    smtp_sink: SmtpSink, provider: EmailProvider, subject: str
) -> None:
    assert provider.send(note(id=5, subject=subject)) == Sent("<notification-5@localhost>")

    [received] = smtp_sink.messages
    assert header_names(received) == BASE
    assert received.message["Subject"] == subject
    assert received.rcpt_tos == ["ada@example.com"]


@pytest.mark.parametrize(
    ("name", "value"),
    [("X-Campaign", ATTACK), ("X-Campaign", LONG_ATTACK), ("Reply-To", ATTACK)],
)
def test_an_encoded_word_in_a_payload_header_adds_no_header(
    smtp_sink: SmtpSink, provider: EmailProvider, name: str, value: str
) -> None:
    if name == "Reply-To":  # an address header: the attack goes into the display name
        value, expect = f"{value} <help@shop.example>", (value, "help@shop.example")
    else:
        expect = (value, "")
    payload: dict[str, Any] = {"headers": {name: value}}

    assert provider.send(note(id=5, payload=payload)) == Sent("<notification-5@localhost>")

    [received] = smtp_sink.messages
    assert header_names(received) == [*BASE[:5], name, *BASE[5:]]
    header = received.message[name]
    if name == "Reply-To":
        [address] = header.addresses
        assert (address.display_name, address.addr_spec) == expect
    else:
        assert str(header) == expect[0]


def send_templated(
    engine: Engine, settings: NotifierSettings, make_row: MakeRow, name: str
) -> tuple[str, str | None]:
    """Render ``Welcome, {{ name }}`` into a row's subject and dispatch it; its status, error."""
    with engine.begin() as conn:
        upsert_template(conn, "welcome", "email", "en", ("Welcome, {{ name }}", "Hello", None))
    make_row(
        channel="email", recipient="ann@example.com", payload={"name": name}, template="welcome"
    )
    dispatcher = Dispatcher(engine, registry_of([EmailProvider(get_settings())]), settings)
    try:
        dispatcher.run_once()
    finally:
        dispatcher.close()
    with engine.connect() as conn:
        status, error = conn.execute(text("SELECT status, last_error FROM notifications")).one()
    return status, error


def test_an_encoded_word_from_a_template_variable_adds_no_header(
    engine: Engine, settings: NotifierSettings, smtp_sink: SmtpSink, make_row: MakeRow
) -> None:
    assert send_templated(engine, settings, make_row, ATTACK) == ("sent", None)

    [received] = smtp_sink.messages
    assert header_names(received) == BASE
    assert received.message["Subject"] == f"Welcome, {ATTACK}"
    assert received.rcpt_tos == ["ann@example.com"]


@pytest.mark.parametrize(
    ("name", "separator"),
    [("U+2028 LINE SEPARATOR", "\u2028"), ("U+000D CARRIAGE RETURN", "\r")],
)
def test_a_template_that_renders_a_separator_into_the_subject_makes_the_row_dead(
    engine: Engine,
    settings: NotifierSettings,
    smtp_sink: SmtpSink,
    make_row: MakeRow,
    name: str,
    separator: str,
) -> None:
    status, error = send_templated(
        engine, settings, make_row, f"Ann{separator}Bcc: eve@evil.example"
    )

    assert status == "dead"
    assert error is not None
    assert error.startswith(f"invalid notification: subject contains {name} at position 12;")
    assert smtp_sink.messages == []


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(subject=values, value=values)
def test_whatever_the_text_the_sink_gets_the_intended_headers_or_nothing(
    smtp_sink: SmtpSink, provider: EmailProvider, subject: str, value: str
) -> None:
    smtp_sink.messages.clear()
    row = note(id=5, subject=subject, payload={"headers": {"X-Note": value}})
    if not (carryable(subject) and carryable(value)):
        with pytest.raises(InvalidNotification):
            provider.validate(row)
        return

    assert provider.send(row) == Sent("<notification-5@localhost>")
    [received] = smtp_sink.messages
    assert header_names(received) == [*BASE[:5], "X-Note", *BASE[5:]]
    assert (str(received.message["Subject"]), str(received.message["X-Note"])) == (subject, value)
