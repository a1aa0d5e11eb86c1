"""The SMTP client's pure parts: the pool's limit after refusals, how content is dot-stuffed,
and that no command can carry a second one."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from notifier.providers.smtp_client import _dot_stuffed, _line
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


@given(
    st.binary(max_size=300) | st.lists(st.sampled_from([b".", b"\r", b"\n", b"a"])).map(b"".join)
)
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
