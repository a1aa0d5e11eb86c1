"""The SMTP client's pure parts: the pool's limit after refusals, how content is dot-stuffed,
that no command can carry a second one, and how what a server sends is cut into replies."""

from __future__ import annotations

import asyncio
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from notifier.providers.smtp_client import (
    MAX_LINE,
    MAX_LINES,
    Reply,
    SmtpError,
    _dot_stuffed,
    _line,
    _Wire,
)
from notifier.providers.smtp_pool import RECOVER_SECONDS, SHRINK_HOLD_SECONDS, Limit


def test_a_refusal_halves_the_limit_and_it_grows_back_one_at_a_time() -> None:
    limit = Limit(40)
    assert limit.now(0.0) == 40

    limit.shrink(100.0)
    assert limit.now(100.0) == 20
    assert limit.now(100.0 + RECOVER_SECONDS) == 21
    assert limit.now(100.0 + 5 * RECOVER_SECONDS) == 25
    assert limit.now(100.0 + 100 * RECOVER_SECONDS) == 40  # and no further


def test_refusals_of_one_overload_halve_it_once() -> None:
    limit = Limit(40)
    limit.shrink(10.0)
    limit.shrink(10.0 + SHRINK_HOLD_SECONDS / 2)  # the other sends refused in the same burst
    assert limit.now(10.0 + SHRINK_HOLD_SECONDS / 2) == 20

    limit.shrink(10.0 + SHRINK_HOLD_SECONDS)  # still refused after that: halve again
    assert limit.now(10.0 + SHRINK_HOLD_SECONDS) == 10


def test_the_limit_never_drops_below_one() -> None:
    limit = Limit(3)
    for i in range(10):
        limit.shrink(i * SHRINK_HOLD_SECONDS)
    assert limit.now(10 * SHRINK_HOLD_SECONDS) == 1


def _received(wire: bytes) -> bytes:
    """What a server makes of ``DATA``'s bytes (RFC 5321 4.5.2): up to the lone dot, with the
    leading dot of each line removed."""
    assert wire.endswith(b"\r\n.\r\n")
    lines = wire[: -len(b".\r\n")].split(b"\r\n")[:-1]
    assert b"." not in lines  # nothing ends the message early
    return b"".join((line[1:] if line.startswith(b".") else line) + b"\r\n" for line in lines)


#: Bytes made mostly of what matters here: dots, line ends of every kind, digits and dashes.
_TRICKY = st.lists(st.sampled_from([b".", b"\r", b"\n", b"a", b"250", b"-", b" "])).map(b"".join)


@given(st.binary(max_size=300) | _TRICKY)
def test_content_reaches_the_server_as_written(content: bytes) -> None:
    wire = _dot_stuffed(content)

    normalized = re.sub(rb"\r\n|\r|\n", b"\r\n", content)
    if not normalized.endswith(b"\r\n"):
        normalized += b"\r\n"
    assert _received(wire) == normalized


@pytest.mark.parametrize(
    "command",
    ["RCPT TO:<a@b.example>\r\nDATA", "RCPT TO:<a@b.example>\nQUIT", "MAIL FROM:<é@b.example>"],
)
def test_a_command_cannot_carry_another(command: str) -> None:
    with pytest.raises(ValueError, match="line break or non-ASCII"):
        _line(command)


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


def _replies_of(chunks: list[bytes]) -> tuple[list[Reply], SmtpError | None]:
    async def feed() -> tuple[list[Reply], SmtpError | None]:
        wire = _Wire()
        wire.connection_made(_Transport())
        for chunk in chunks:
            wire.data_received(chunk)
        return list(wire.replies), wire.failure

    return asyncio.run(feed())


@given(st.lists(st.binary(max_size=200) | _TRICKY, max_size=8))
def test_whatever_a_server_sends_is_replies_or_an_ended_connection(chunks: list[bytes]) -> None:
    replies, failure = _replies_of(chunks)  # never raises: a bad answer ends the connection

    for reply in replies:
        assert 100 <= reply.code <= 599
    assert failure is None or isinstance(failure, SmtpError)


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        pytest.param([b"250 OK\r\n"], [Reply(250, b"OK")], id="one-line"),
        pytest.param([b"25", b"0-a\r\n250", b" b\r\n"], [Reply(250, b"a\nb")], id="split"),
        pytest.param([b"220\r\n"], [Reply(220, b"")], id="no-text"),
        pytest.param([b"250-a\n250 b\n"], [Reply(250, b"a\nb")], id="bare-lf"),
    ],
)
def test_replies_are_read_across_chunks(chunks: list[bytes], expected: list[Reply]) -> None:
    assert _replies_of(chunks) == (expected, None)


@pytest.mark.parametrize(
    "chunks",
    [
        pytest.param([b"x" * (MAX_LINE + 1)], id="endless-line"),
        pytest.param([b"250-more\r\n" * (MAX_LINES + 1)], id="endless-reply"),
        pytest.param([b"HTTP/1.1 200 OK\r\n"], id="not-smtp"),
    ],
)
def test_a_hostile_answer_ends_the_connection(chunks: list[bytes]) -> None:
    replies, failure = _replies_of(chunks)
    assert replies == []
    assert isinstance(failure, SmtpError)
