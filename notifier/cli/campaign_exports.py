"""``notifier campaign failures``: a campaign's failed recipients and why, as CSV.
``notifier.cli.campaigns`` adds it to the ``campaign`` group."""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import click
from sqlalchemy import Engine

from notifier import db
from notifier.campaigns.failures import campaign_id, failures_csv
from notifier.cli import output, terminal
from notifier.cli.base import Command
from notifier.db.failures import PAGE, failed_pages


@click.command(
    cls=Command,
    short_help="Export the recipients a campaign did not reach, with the reasons, as CSV.",
    help="Write campaign NAME's failed recipients as CSV (UTF-8, a header line, then one line"
    " each, by recipient): its dead rows, and sent rows the provider later reported"
    " undelivered or bounced. Columns: recipient, status, reason, attempts, last_attempt_at,"
    " id. A cell that a spreadsheet would read as a formula (starting with = + - @, a tab or a"
    " line break) is written with a leading '. Read in pages of 5,000: a million rows are"
    " never held in memory. With --json, one JSON array of objects with the same fields instead"
    " (on one line, values as they are: JSON is read by programs, not spreadsheets).\n\n"
    "Exit status: 0 written (a header only when nothing failed), 2 no such campaign.\n\n"
    "\b\nExamples:\n"
    "  notifier campaign failures spring --output spring-failures.csv\n"
    "  notifier campaign failures spring | head",
)
@click.argument("name")
@click.option(
    "--output",
    "-o",
    "path",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    metavar="FILE",
    help="Write to FILE (replaced only once the whole export is written); default stdout.",
)
@output.json_option
def failures(name: str, path: Path | None) -> int:
    engine = db.engine()
    campaign = campaign_id(engine, name)
    pieces = (
        failures_json(engine, campaign) if output.json_wanted() else failures_csv(engine, campaign)
    )
    if path is None:
        written = _write(pieces, sys.stdout.buffer)
        sys.stdout.buffer.flush()
    else:
        written = _write_file(pieces, path)
    where = "" if path is None else f" to {output.quoted(str(path))}"
    output.note(f"{written} failed recipients of campaign {output.quoted(name)}{where}")
    return 0


def failures_json(engine: Engine, campaign: int, page: int = PAGE) -> Iterator[tuple[str, int]]:
    """The failures as one JSON array, a page at a time, as ``failures_csv`` gives the CSV."""
    yield "[", 0
    first = True
    for rows in failed_pages(engine, campaign, page):
        objects = terminal.json_text([dataclasses.asdict(f) for f in rows])[1:-1]
        yield ("" if first else ",") + objects, len(rows)
        first = False
    yield "]\n", 0


def _write(pieces: Iterator[tuple[str, int]], out: IO[bytes]) -> int:
    written = 0
    for text, rows in pieces:
        out.write(text.encode())
        written += rows
    return written


def _write_file(pieces: Iterator[tuple[str, int]], path: Path) -> int:
    """Write beside ``path`` and rename over it at the end: an export that fails half-way
    leaves no half file that looks whole."""
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "wb") as out:
            written = _write(pieces, out)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return written
