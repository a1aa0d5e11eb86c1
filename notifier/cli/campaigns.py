"""``notifier campaign ...``: create, import, launch, watch, pause, resume and cancel campaigns."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from notifier import db
from notifier.campaigns import MOST_PARALLEL, PARALLEL, Campaigns, Progress
from notifier.campaigns.audience_file import text_lines
from notifier.cli import output, terminal
from notifier.cli.base import Group, exclusive
from notifier.cli.output import Text
from notifier.cli.parsing import JSON_OBJECT
from notifier.db.audience import AudienceImport
from notifier.models import CampaignStatus

#: How often ``--watch`` looks at the campaign's counts, in seconds.
WATCH_EVERY = 1.0

_NAME = click.argument("name")


@click.group(
    cls=Group,
    short_help="Send one message to a large audience, a code for each recipient.",
    help="Send one message to a large audience, each recipient with a promo code of their own."
    " Every step can be run again: a launch that died half-way is finished by launching again,"
    " and nobody gets a second row or a second code.\n\n"
    "\b\nIn order:\n"
    "  notifier campaign create spring --channel email \\\n"
    "      --subject 'A gift for you, {name}' --body 'Your code: {code}.'\n"
    "  notifier campaign audience spring --csv users.csv --recipient-column email\n"
    "  notifier campaign codes spring --generate 100000\n"
    "  notifier campaign launch spring\n"
    "  notifier campaign status spring --watch",
)
def campaign() -> None:
    pass


def _campaigns() -> Campaigns:
    return Campaigns(db.engine())


@campaign.command(
    short_help="Create a draft campaign.",
    help="Create a draft campaign named NAME. Subject and body are templates with {placeholders}:"
    " {recipient}, {code} and any audience field (a CSV column or query column); or name a"
    " stored Jinja2 template with --template, whose {{ variables }} are the same fields. A field"
    " missing for any recipient stops the launch before anything is written.",
)
@_NAME
@click.option(
    "--channel",
    required=True,
    metavar="CHANNEL",
    help="Channel every row goes out on: email, sms, push, webhook, ...",
)
@click.option("--subject", metavar="TEMPLATE", help="e.g. 'Your code, {name}'.")
@click.option("--body", metavar="TEMPLATE", help="e.g. 'Use {code} before Friday.'")
@click.option(
    "--template",
    metavar="NAME",
    help="A stored template (notifier template add) instead of --subject and --body: rendered"
    " per recipient by the worker, HTML included, from the recipient's fields and code.",
)
@click.option(
    "--locale",
    metavar="LOCALE",
    help="The stored template's locale, e.g. de-AT (falls back to de, then the default).",
)
@click.option(
    "--payload",
    type=JSON_OBJECT,
    default="{}",
    metavar="JSON",
    help="A JSON object put into every row's payload (beside code and campaign).",
)
@click.option(
    "--priority",
    type=int,
    default=-10,
    metavar="N",
    help="Priority of the campaign's rows; below 0 lets transactional rows (0) go first.",
)
@click.option(
    "--max-attempts",
    type=int,
    default=5,
    metavar="N",
    help="Attempts per row before it is given up as dead.",
)
@click.option(
    "--category",
    default="marketing",
    show_default=True,
    metavar="NAME",
    help="What the campaign's messages are: a one-click unsubscribe opts out of this category"
    " only, e.g. marketing or newsletter.",
)
@output.json_option
def create(
    name: str,
    channel: str,
    subject: str | None,
    body: str | None,
    template: str | None,
    locale: str | None,
    payload: dict[str, Any],
    priority: int,
    max_attempts: int,
    category: str,
) -> int:
    campaign_id = _campaigns().create(
        name,
        channel,
        subject=subject,
        body=body,
        template=template,
        locale=locale,
        payload=payload,
        priority=priority,
        max_attempts=max_attempts,
        category=category,
    )
    output.emit(
        {"name": name, "id": campaign_id},
        Text(f"created campaign {output.quoted(name)} (id {campaign_id}); import an audience next"),
    )
    return 0


@campaign.command(
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
        report = _campaigns().import_query(name, query, skip_invalid=skip_invalid)
        said = f"{report.added} recipients added{_invalid(report, 'rows')}"
        output.emit({"name": name, "added": report.added, **_invalid_data(report)}, Text(said))
        return 0
    with csv.open("rb") as raw:
        lines = text_lines(output.read_with_progress(raw, "reading"))
        report = _campaigns().import_csv(
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


@campaign.command(
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
            added = _campaigns().import_codes(name, (line.strip() for line in read))
    else:
        assert generate is not None
        added = _campaigns().generate_codes(name, generate, length)
    output.emit({"name": name, "added": added}, Text(f"{added} codes added to the pool"))
    return 0


@campaign.command(
    short_help="Write one notification per recipient, then watch them go.",
    help="Write campaign NAME's notifications, one per recipient, in chunks of 50,000, then"
    " watch them being sent until nothing is left (Ctrl-C stops watching, not the campaign)."
    " Safe to run again: an interrupted launch is finished, and a finished one writes only the"
    " recipients added since. On a terminal, progress is drawn on stderr.",
)
@_NAME
@click.option(
    "--no-watch",
    is_flag=True,
    help="Return once the rows are written, without watching them being sent.",
)
@click.option(
    "--parallel",
    type=click.IntRange(1, MOST_PARALLEL),
    default=PARALLEL,
    metavar="N",
    help=f"Chunks written at once, each on a database connection of its own (1 to"
    f" {MOST_PARALLEL}).",
)
@output.json_option
def launch(name: str, no_watch: bool, parallel: int) -> int:
    campaigns = _campaigns()
    before = campaigns.status(name).counts
    with output.progress("writing", before.recipients) as bar:
        bar.show(before.notifications)  # a launch run again writes only what is missing
        written = campaigns.launch(name, bar.advance, parallel=parallel)
        bar.show(before.recipients)
    said = Text(f"campaign {output.quoted(name)}: {written} notifications written")
    if no_watch:
        output.emit({"name": name, "written": written}, said)
        return 0
    final = _watch(campaigns, name)
    output.emit({"name": name, "written": written, **_data(final)}, said, Text(_summary(final)))
    return 0


@campaign.command(
    short_help="Counts of the campaign's notifications.",
    help="Where campaign NAME stands: recipients, codes, and its notifications by status.",
)
@_NAME
@click.option(
    "--watch",
    is_flag=True,
    help="Refresh (a bar on a terminal's stderr) until nothing is left to send, then print"
    " the counts.",
)
@output.json_option
def status(name: str, watch: bool) -> int:
    campaigns = _campaigns()
    progress = _watch(campaigns, name) if watch else campaigns.status(name)
    output.emit(_data(progress), Text(_summary(progress)))
    return 0


def _simple(verb: str, done: str, said: str, short: str, text: str) -> None:
    """``pause``, ``resume`` or ``cancel``: one call, one line saying how many rows it moved."""

    @campaign.command(verb, short_help=short, help=text)
    @_NAME
    @output.json_option
    def command(name: str) -> int:
        count = getattr(_campaigns(), verb)(name)
        output.emit(
            {"name": name, "status": done, "notifications": count},
            Text(f"campaign {output.quoted(name)}: {done}; {count} notifications {said}"),
        )
        return 0


@campaign.command(
    short_help="Stop sending now; resume continues.",
    help="Stop sending campaign NAME now: its pending rows are held back, and rows a worker had"
    " already claimed are handed back before their send (unless it has begun), to be held"
    " back too: 'status' counts them all as held back. 'resume' continues.",
)
@_NAME
@output.json_option
def pause(name: str) -> int:
    paused = _campaigns().pause(name)
    claimed = (
        f"; {paused.claimed} claimed by workers are handed back unless their send has begun"
        if paused.claimed
        else ""
    )
    output.emit(
        {
            "name": name,
            "status": "paused",
            "notifications": paused.held,
            "claimed": paused.claimed,
        },
        Text(
            f"campaign {output.quoted(name)}: paused; {paused.held} notifications held back"
            f"{claimed}"
        ),
    )
    return 0


_simple(
    "resume",
    "resumed",
    "released",
    "Continue a paused campaign.",
    "Continue the paused campaign NAME: its held-back rows are due again.",
)
_simple(
    "cancel",
    "cancelled",
    "cancelled",
    "Cancel every unsent notification, for good.",
    "Cancel every unsent notification of campaign NAME, including those of a launch under way."
    " Final: a cancelled campaign cannot be launched again; create a new one to send it.",
)


def _watch(campaigns: Campaigns, name: str) -> Progress:
    """Look at the campaign every second, drawing its progress, until it is finished or
    cancelled, or nothing is left to send, or the operator presses Ctrl-C; then its final
    counts. A paused campaign is watched on (it may be resumed), saying so once on stderr."""
    said_paused = False
    try:
        with output.progress("sending", campaigns.status(name).counts.notifications) as bar:
            while True:
                status = campaigns.status(name)
                state = status.campaign.status
                total = status.counts.notifications
                paused = state == CampaignStatus.paused
                note = f"{_counts(status)}  paused" if paused else _counts(status)
                bar.show(total - status.unfinished, total, note)
                if paused and not said_paused:
                    output.note(
                        f"campaign {output.quoted(name)} is paused: watching until it is"
                        " resumed and done, or cancelled (Ctrl-C stops watching)"
                    )
                said_paused = paused
                done = state in (CampaignStatus.finished, CampaignStatus.cancelled)
                if done or (status.unfinished == 0 and not paused):
                    break
                time.sleep(WATCH_EVERY)
    except KeyboardInterrupt:
        pass  # stop watching; the campaign goes on
    return campaigns.status(name)


def _data(status: Progress) -> dict[str, Any]:
    c = status.counts
    return {
        "name": status.campaign.name,
        "status": status.campaign.status,
        "recipients": c.recipients,
        "codes": c.codes,
        "codes_given": c.codes_given,
        "enqueued": c.notifications,
        "by_status": c.by_status,
        "retrying": c.retrying,
        "held": c.held,
    }


def _counts(status: Progress) -> str:
    c = status.counts
    return (
        f"enqueued {c.notifications}  sent {status.sent}  retrying {c.retrying}  dead {status.dead}"
    )


def _summary(status: Progress) -> str:
    c = status.counts
    lines = [
        f"campaign {output.quoted(status.campaign.name)}"
        f" ({terminal.shown(status.campaign.channel)}): {status.campaign.status}",
        f"  recipients {c.recipients}   codes {c.codes} ({c.codes_given} given)",
        f"  {_counts(status)}"
        + "".join(f"  {s} {n}" for s, n in sorted(c.by_status.items()) if s not in ("sent", "dead"))
        + (f"  (held back {c.held})" if c.held else ""),
    ]
    return "\n".join(lines)
