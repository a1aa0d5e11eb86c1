"""Unsubscribe tokens and forms, as whoever holds a link may write them: never an error, never a
subscription the secret did not seal, and no path in an access log line."""

from __future__ import annotations

import logging

from hypothesis import given, settings
from hypothesis import strategies as st

from notifier import unsubscribe
from notifier.events.app import UNSUBSCRIBE_FORMS, _fields
from notifier.logs import RedactPaths

SECRET = "unit-secret"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_any_text_is_no_token_unless_sealed(token: str) -> None:
    assert unsubscribe.read_token(SECRET, token) is None


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(["email", "sms"]),
    st.text(min_size=1, max_size=200).filter(lambda t: "\0" not in t),
    st.from_regex(r"[a-z0-9_.-]{1,64}", fullmatch=True),
)
def test_a_sealed_token_reads_back_and_only_with_its_secret(
    channel: str, recipient: str, category: str
) -> None:
    token = unsubscribe.make_token(SECRET, channel, recipient, category)
    found = unsubscribe.read_token(SECRET, token)
    assert found is not None
    assert (found.channel, found.category) == (channel, category)
    assert found.recipient == recipient
    assert unsubscribe.read_token(SECRET + "x", token) is None


@settings(max_examples=200, deadline=None)
@given(
    st.binary(max_size=600),
    st.sampled_from(
        [
            "",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=b",
            "multipart/form-data",
            "multipart/form-data; boundary=",
        ]
    ),
)
def test_any_body_is_read_as_a_form_or_refused_never_raises(body: bytes, kind: str) -> None:
    fields = _fields(body, kind)
    if fields in UNSUBSCRIBE_FORMS:
        assert b"One-Click" in body or b"unsubscribe" in body


def test_a_message_without_a_category_gets_a_link_for_every_category() -> None:
    from notifier.settings import Settings

    s = Settings(events_public_url="https://e.example", unsubscribe_secret=SECRET)
    for category, named in ((None, ""), ("news", "news")):
        found = unsubscribe.headers(s, "email", "a@example.com", category)
        token = found["List-Unsubscribe"].split("/u/")[1].split(">")[0]
        subscription = unsubscribe.read_token(SECRET, token)
        assert subscription is not None
        assert subscription.category == named
    assert unsubscribe.headers(Settings(), "email", "a@example.com", "news") == {}


def test_the_access_log_keeps_no_unsubscribe_path() -> None:
    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5", "POST", "/u/SECRET-TOKEN?x=1", "1.1", 200), None,
    )  # fmt: skip
    assert RedactPaths().filter(record)
    assert record.getMessage() == '127.0.0.1:5 - "POST /u/… HTTP/1.1" 200'
