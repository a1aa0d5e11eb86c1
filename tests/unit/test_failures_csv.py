"""The CSV of a campaign's failures: whatever a recipient or a provider's error text holds, it
reads back as it was and no cell starts as a spreadsheet formula."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from notifier.campaigns.failures import (
    FORMULA_STARTS,
    HEADER,
    csv_text,
    failure_row,
    safe_cell,
    text_of,
)
from notifier.db.failures import Failure

# What PostgreSQL's text can hold: no NUL, no lone surrogate.
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
# Starts worth trying often: the formula characters, a quote of one's own, line breaks.
HOSTILE = st.builds(
    "".join,
    st.lists(st.sampled_from([*FORMULA_STARTS, "'", '"', ",", "\r\n", " ", "=cmd|' /C calc'!A0"])),
).flatmap(lambda head: TEXT.map(lambda tail: head + tail))
VALUES = st.one_of(TEXT, HOSTILE)


def _read(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text, newline="")))


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(VALUES, VALUES), min_size=1, max_size=5))
def test_any_recipient_and_reason_read_back_and_start_no_formula(
    pairs: list[tuple[str, str]],
) -> None:
    at = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
    failures = [Failure(r, "dead", why, 5, at, i) for i, (r, why) in enumerate(pairs)]
    text = csv_text([HEADER, *(failure_row(f) for f in failures)])

    table = _read(text)

    assert table[0] == list(HEADER)
    assert len(table) == len(failures) + 1  # line breaks inside a cell make no new row
    for f, cells in zip(failures, table[1:], strict=True):
        assert [text_of(cells[0]), cells[1], text_of(cells[2])] == [f.recipient, "dead", f.reason]
        assert cells[3:] == ["5", "2026-12-01T09:30:00+00:00", str(f.id)]
        for cell in cells:
            assert not cell.startswith(FORMULA_STARTS)


def test_the_escapes() -> None:
    assert [safe_cell(v) for v in ["=1+1", "+1", "-1", "@SUM(A1)", "\tx", "\rx", "'=x", "a=b"]] == [
        "'=1+1",
        "'+1",
        "'-1",
        "'@SUM(A1)",
        "'\tx",
        "'\rx",
        "''=x",
        "a=b",
    ]
    assert text_of("''=x") == "'=x"
    assert text_of("'plain") == "'plain"  # a ' not written by safe_cell stays
