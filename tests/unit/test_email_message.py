"""Properties of ``notifier.providers.email_message.build``: whatever text a row carries, the
message either is refused with a reason, or has exactly the intended headers, each reading back
as written. Parsed with the standard library, as a receiver on this Python would."""

from __future__ import annotations

import email
import email.policy
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from notifier.providers import email_wire
from notifier.providers.base import InvalidNotification
from notifier.providers.email_message import build, check_text, parse_mailbox

BASE = ["From", "To", "Subject", "Date", "Message-ID"]
MIME = ["Content-Type", "Content-Transfer-Encoding", "MIME-Version"]
ATTACK = "=?utf-8?q?Hi=0D=0ABcc:_eve@evil.example?="
ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
DOT_ATOM = rf"{ATEXT}(\.{ATEXT})*@[a-z0-9-]+\.[a-z]+"

# Encoded-word shapes, well formed or not, with CR/LF and header syntax in their payloads.
encoded_words = st.builds(
    "=?{}?{}?{}?=".format,
    st.sampled_from(["utf-8", "UTF-8", "iso-8859-1", "us-ascii", "x-unknown", ""]),
    st.sampled_from(["q", "Q", "b", "B", "x"]),
    st.lists(
        st.sampled_from(["=0D", "=0A", "_", "Bcc:", "eve@evil.example", "SGk=", "DQo=", "?", "="])
        | st.text(alphabet="abcXYZ019=_: ", max_size=5),
        max_size=8,
    ).map("".join),
)
separators = st.sampled_from(
    ["\r", "\n", "\r\n", "\x00", "\x0b", "\x0c", "\x85", "\u2028", "\u2029", "\x1b", "\x9b"]
)
pieces = st.one_of(
    st.text(max_size=30),
    encoded_words,
    separators,
    st.sampled_from([" ", "  ", "\t", " \t ", "Bcc: eve@evil.example", "é", "✓", "日本"]),
    st.text(alphabet="abcdefghij ", min_size=60, max_size=300),  # long enough to fold
)
values = st.lists(pieces, max_size=8).map("".join)
header_names = st.from_regex(r"X-[A-Za-z0-9-]{1,20}", fullmatch=True)


def compose(
    subject: str = "Hi",
    headers: dict[str, str] | None = None,
    reply_to: tuple[str, str] | None = None,
) -> bytes:
    return build(
        sender="Shop <noreply@shop.example>",
        recipient="ada@example.com",
        subject=subject,
        date="Thu, 01 Jan 2026 00:00:00 +0000",
        message_id="<notification-1@shop.example>",
        headers=headers or {},
        reply_to=reply_to,
        body="Hello",
        html=None,
    )


def parse(wire: bytes) -> Any:
    return email.message_from_bytes(wire, policy=email.policy.default)


def carryable(text: str) -> bool:
    try:
        check_text("text", text)
    except InvalidNotification:
        return False
    return True


@settings(max_examples=200, deadline=None)
@given(subject=values)
def test_a_subject_is_refused_or_reads_back_exactly(subject: str) -> None:
    if not carryable(subject):
        with pytest.raises(InvalidNotification, match="contains U\\+"):
            compose(subject)
        return
    message = parse(compose(subject))
    assert [name for name, _ in message.raw_items()] == BASE + MIME
    assert str(message["Subject"]) == subject


@settings(max_examples=200, deadline=None)
@given(headers=st.dictionaries(header_names, values, max_size=3))
def test_extra_headers_are_refused_or_read_back_exactly(headers: dict[str, str]) -> None:
    if not all(carryable(v) for v in headers.values()):
        with pytest.raises(InvalidNotification, match="contains U\\+"):
            compose(headers=headers)
        return
    message = parse(compose(headers=headers))
    assert [name for name, _ in message.raw_items()] == [*BASE, *headers, *MIME]
    assert {name: str(message[name]) for name in headers} == headers


@settings(max_examples=200, deadline=None)
@given(written=values.filter(lambda v: len(v.encode()) <= 60 and "<" not in v and ">" not in v))
def test_a_reply_to_display_name_is_refused_or_reads_back_exactly(written: str) -> None:
    try:
        display_name, _ = parse_mailbox("Reply-To", f"{written} <help@shop.example>")
    except InvalidNotification as exc:
        refused = str(exc)
    else:
        refused = None
    if refused is not None:
        assert not carryable(written) or "bytes in UTF-8; at most 42 unless" in refused
        return
    wire = compose(reply_to=(display_name, "help@shop.example"))
    message = parse(wire)
    assert [name for name, _ in message.raw_items()] == [*BASE, "Reply-To", *MIME]
    [address] = message["Reply-To"].addresses
    assert (address.display_name, address.addr_spec) == (display_name, "help@shop.example")


@pytest.mark.parametrize("value", [ATTACK, f"Your order {ATTACK} {ATTACK} shipped", "a" * 990])
def test_the_reported_attack_reads_back_as_text(value: str) -> None:
    message = parse(compose(value, headers={"X-Note": value}))

    assert [name for name, _ in message.raw_items()] == [*BASE, "X-Note", *MIME]
    assert str(message["Subject"]) == str(message["X-Note"]) == value


def test_every_line_keeps_within_the_limits() -> None:
    wire = compose("Grüße " * 150, headers={"X-Words": "word " * 199 + "end"})
    head = wire.partition(b"\r\n\r\n")[0]
    assert max(len(line) for line in head.split(b"\r\n")) <= 78


@pytest.mark.parametrize(
    ("value", "expect"),
    [
        ("help@shop.example", ("", "help@shop.example")),
        ("Help Desk <help@shop.example>", ("Help Desk", "help@shop.example")),
        ('"Help, \\"Desk\\"" <help@shop.example>', ('Help, "Desk"', "help@shop.example")),
        (f"{ATTACK} <help@shop.example>", (ATTACK, "help@shop.example")),
    ],
)
def test_parse_mailbox(value: str, expect: tuple[str, str]) -> None:
    assert parse_mailbox("Reply-To", value) == expect
    [address] = parse(compose(reply_to=expect))["Reply-To"].addresses
    assert (address.display_name, address.addr_spec) == expect


def test_a_from_the_standard_library_misreads_is_refused() -> None:
    # The deployment's own sender goes through the standard library; the check covers it too.
    with pytest.raises(InvalidNotification, match=r"cannot be written|would not read back"):
        build(
            sender=f"{ATTACK} <noreply@shop.example>",
            recipient="ada@example.com",
            subject="Hi",
            date="Thu, 01 Jan 2026 00:00:00 +0000",
            message_id="<notification-1@shop.example>",
            headers={},
            reply_to=None,
            body="Hello",
            html=None,
        )


# What ``build`` takes as written, unparsed: it must be what the standard library reads.
plain_addresses = st.from_regex(
    r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]{1,20}@[a-z0-9-]{1,10}\.[a-z]{2,5}", fullmatch=True
)
message_ids = st.from_regex(
    r"<[A-Za-z0-9_.+-]{1,20}@[A-Za-z0-9-]{1,10}(\.[a-z]{1,5}){0,2}>", fullmatch=True
)


def addressed(recipient: str, message_id: str) -> bytes:
    return build(
        sender="Shop <noreply@shop.example>",
        recipient=recipient,
        subject="Hi",
        date="Thu, 01 Jan 2026 00:00:00 +0000",
        message_id=message_id,
        headers={},
        reply_to=None,
        body="Hello",
        html="<p>Hello</p>",
    )


@settings(max_examples=300, deadline=None)
@given(recipient=plain_addresses, message_id=message_ids)
def test_an_address_and_a_message_id_are_refused_or_read_back_exactly(
    recipient: str, message_id: str
) -> None:
    try:
        wire = addressed(recipient, message_id)
    except InvalidNotification:
        # Only what is not plain goes to the parser, and only it may be refused.
        assert not re.fullmatch(DOT_ATOM, recipient) or "=?" in recipient
        return
    message = parse(wire)
    assert [name for name, _ in message.raw_items()] == [*BASE, "MIME-Version", "Content-Type"]
    [address] = message["To"].addresses
    assert (address.display_name, address.addr_spec) == ("", recipient)
    assert str(message["Message-ID"]) == message_id


def test_an_address_header_among_the_extra_headers_is_refused() -> None:
    # Extra headers are text; one the standard library reads as addresses is not written.
    with pytest.raises(InvalidNotification, match="Cc header would read back"):
        compose(headers={"Cc": "eve@evil.example"})


def test_messages_that_share_their_content_differ_only_in_their_own_headers() -> None:
    first, second = (
        addressed("ada@example.com", "<n-1@x.example>"),
        addressed("bob@example.com", "<n-2@x.example>"),
    )
    assert first.partition(b"MIME-Version")[2] == second.partition(b"MIME-Version")[2]
    assert parse(second)["To"].addresses[0].addr_spec == "bob@example.com"


@settings(max_examples=300, deadline=None)
@given(
    body=st.lists(
        st.text(alphabet=st.characters(max_codepoint=127), max_size=90)
        | st.sampled_from(["\r\n", "\n", "\r", "\r\r\n", "x" * 78, "y" * 79, ".", "From me"]),
        max_size=6,
    ).map("".join)
)
def test_a_plain_body_is_written_as_the_standard_library_writes_it(body: str) -> None:
    assert email_wire.mime_part(body, None) == email_wire.stdlib_part(body, None)
