"""A campaign's failed recipients as CSV, for ``notifier campaign failures`` and the console's
download alike: one header, then a line per recipient, written a page at a time so that a
million failures never sit in memory.

Recipients and the providers' error texts are written by whoever the campaign reached, or by a
provider answering for them. A spreadsheet reads a cell starting with ``=``, ``+``, ``-``,
``@``, a tab or a carriage return as a formula (CSV injection, which can run commands or send
the sheet's cells elsewhere when the file is opened), so such a cell is written with a leading
``'``, which the spreadsheet shows as text; so is one that starts with ``'`` itself, so that
what was escaped can be told from what was not (``text_of``). Everything else is written as it
is, quoted by the ``csv`` module where a comma, a quote or a line break asks for it.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator, Sequence

from sqlalchemy import Engine

from notifier.campaigns.messages import CampaignError
from notifier.db import bulk
from notifier.db.failures import PAGE, Failure, failed_pages

HEADER = ("recipient", "status", "reason", "attempts", "last_attempt_at", "id")
#: What makes a spreadsheet read a cell as a formula (OWASP's list, and a line feed).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\n")
#: A cell starting with either gets a ``'`` in front.
ESCAPED_STARTS = (*FORMULA_STARTS, "'")


def safe_cell(value: str) -> str:
    """``value`` as a spreadsheet will show it and not run it: a ``'`` before a formula's
    first character, and before a ``'`` of the value's own, so that ``text_of`` can always
    tell the two apart."""
    return "'" + value if value.startswith(ESCAPED_STARTS) else value


def text_of(cell: str) -> str:
    """What ``safe_cell`` was given, from what it wrote."""
    return cell[1:] if cell.startswith("'") and cell[1:].startswith(ESCAPED_STARTS) else cell


def failure_row(f: Failure) -> list[str]:
    at = "" if f.last_attempt_at is None else f.last_attempt_at.isoformat()
    return [safe_cell(f.recipient), f.status, safe_cell(f.reason), str(f.attempts), at, str(f.id)]


def csv_text(rows: Iterable[Sequence[str]]) -> str:
    """``rows`` as CSV lines, ending in CRLF as RFC 4180 has it."""
    buffer = io.StringIO()
    csv.writer(buffer).writerows(rows)
    return buffer.getvalue()


def campaign_id(engine: Engine, name: str) -> int:
    """The campaign's id; ``CampaignError`` naming it when there is none."""
    with engine.connect() as conn:
        found = bulk.campaign_id(conn, name)
    if found is None:
        raise CampaignError(f"no campaign named {name!r}")
    return found


def failures_csv(engine: Engine, campaign: int, page: int = PAGE) -> Iterator[tuple[str, int]]:
    """The CSV text of campaign ``campaign``'s failures, a piece at a time with the number of
    recipients in it: the header (0), then one piece per page."""
    yield csv_text([HEADER]), 0
    for rows in failed_pages(engine, campaign, page):
        yield csv_text(failure_row(f) for f in rows), len(rows)
