"""``notifier campaign audience`` and ``codes``: filling a campaign's audience (a CSV file or a
query) and its code pool (a file, or generated). ``notifier.cli.campaigns`` adds them to the
``campaign`` group.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from notifier import db
from notifier.campaigns import Campaigns
from notifier.campaigns.audience_file import text_lines
from notifier.cli import output
from notifier.cli.base import Command, exclusive
from notifier.cli.output import Text
from notifier.db.audience import AudienceImport

_NAME = click.argument("name")


def campaign_service() -> Campaigns:
    """The campaigns of the process's database; a launch locks through its session URL."""
    return Campaigns(db.engine(), session=db.session_engine())


@click.command(
    cls=Command,
    short_help="Import recipients from a CSV file or a query.",
    help="Add recipients to campaign NAME, from a CSV file (with a header row; the other"
    " columns become fields for the templates) or from a query. A recipient already there"
    " counts once. The query runs read-only as the role notifier_audience, stopped after"
    " NOTIFIER_AUDIENCE_QUERY_TIMEOUT.\n\n"
    "\b\nExamples:\n"
    "  notifier campaign audience spring --csv users.csv --recipient-column email\n"
    '  notifier campaign audience spring --query "SELECT email AS recipient,\n'
    '      first_name AS name FROM users WHERE opted_in"',
)
@_NAME
@click.option(
    "--csv",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    metavar="FILE",
    help="A CSV file (UTF-8, with or without a byte order mark: a spreadsheet's CSV UTF-8)"
    " with a header row. Instead of --query.",
)
@click.option(
    "--query",
    metavar="SQL",
    help="SQL returning a 'recipient' column and any fields. Instead of --csv.",
)
@click.option(
    "--recipient-column",
    default="recipient",
    metavar="COLUMN",
    help="The CSV column holding the recipients.",
)
@click.option(
    "--on-duplicate",
    type=click.Choice(["skip", "refuse"]),
    default="skip",
    show_default=True,
    help="A recipient on several lines of the CSV: keep its first line and report the others"
    " (skip), or import nothing and name the repeat (refuse).",
)
@click.option(
    "--skip-invalid",
    is_flag=True,
    help="Import the other recipients when some cannot be sent to on the campaign's channel"
    " (not an email address, not an E.164 number...), and report the lines skipped; without"
    " it, such a recipient refuses the whole import.",
)
@output.json_option
def audience(
    name: str,
    csv: Path | None,
    query: str | None,
    recipient_column: str,
    on_duplicate: str,
    skip_invalid: bool,
) -> int:
    exclusive(click.get_current_context(), "csv", "query", required=True)
    if csv is None:
        assert query is not None
        report = campaign_service().import_query(name, query, skip_invalid=skip_invalid)
        said = f"{report.added} recipients added{_invalid(report, 'rows')}"
        output.emit({"name": name, "added": report.added, **_invalid_data(report)}, Text(said))
        return 0
    with csv.open("rb") as raw:
        lines = text_lines(output.read_with_progress(raw, "reading"))
        report = campaign_service().import_csv(
            name, lines, recipient_column, on_duplicate=on_duplicate, skip_invalid=skip_invalid
        )
    said = f"{report.added} recipients added"
    if report.duplicates:
        named = "; ".join(
            f"line {d.line}: {output.quoted(d.recipient)}, first on line {d.first_line}"
            for d in report.examples
        )
        more = ", ..." if report.duplicates > len(report.examples) else ""
        said += f"; {report.duplicates} repeated lines skipped ({named}{more})"
    data = {
        "name": name,
        "added": report.added,
        "fields": report.fields,
        "duplicates": report.duplicates,
        "examples": [
            {"line": d.line, "recipient": d.recipient, "first_line": d.first_line}
            for d in report.examples
        ],
        **_invalid_data(report),
    }
    output.emit(data, Text(said + _invalid(report, "lines")))
    return 0


def _invalid(report: AudienceImport, what: str) -> str:
    """What ``--skip-invalid`` left out, for the line an import prints."""
    if not report.invalid:
        return ""
    named = "; ".join(
        f"{what[:-1]} {i.line}: {output.quoted(i.recipient)}: {i.reason}"
        for i in report.invalid_examples
    )
    more = "; ..." if report.invalid > len(report.invalid_examples) else ""
    return f"; {report.invalid} {what} skipped, their recipient cannot be sent to ({named}{more})"


def _invalid_data(report: AudienceImport) -> dict[str, Any]:
    return {
        "invalid": report.invalid,
        "invalid_examples": [
            {"line": i.line, "recipient": i.recipient, "reason": i.reason}
            for i in report.invalid_examples
        ],
    }


@click.command(
    cls=Command,
    short_help="Add codes to the pool: from a file, or generated.",
    help="Add promo codes to campaign NAME's pool, from a file (one per line) or generated (hex"
    " characters from the operating system's cryptographic random source). A code already in"
    " the pool counts once; recipient N gets code N.\n\n"
    "\b\nExamples:\n"
    "  notifier campaign codes spring --file codes.txt\n"
    "  notifier campaign codes spring --generate 1000000 --length 12",
)
@_NAME
@click.option(
    "--file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    metavar="FILE",
    help="A file of codes, one per line (UTF-8). Instead of --generate.",
)
@click.option(
    "--generate",
    type=click.IntRange(min=1),
    metavar="N",
    help="Generate N random codes. Instead of --file.",
)
@click.option(
    "--length",
    type=int,
    default=12,
    metavar="N",
    help="Characters per generated code, 8 to 32.",
)
@output.json_option
def codes(name: str, file: Path | None, generate: int | None, length: int) -> int:
    exclusive(click.get_current_context(), "file", "generate", required=True)
    if file is not None:
        with file.open(encoding="utf-8") as lines:
            read = output.read_with_progress(lines, "reading")
            added = campaign_service().import_codes(name, (line.strip() for line in read))
    else:
        assert generate is not None
        added = campaign_service().generate_codes(name, generate, length)
    output.emit({"name": name, "added": added}, Text(f"{added} codes added to the pool"))
    return 0
