"""``notifier campaign ...``: create, launch, watch, pause, resume and cancel campaigns; the
imports (``audience``, ``codes``) are ``notifier.cli.campaign_imports``, the export of failures
``notifier.cli.campaign_exports``."""

from __future__ import annotations

import time
from typing import Any

import click

from notifier.campaigns import MOST_PARALLEL, PARALLEL, Campaigns, Progress
from notifier.cli import output, terminal
from notifier.cli.base import Group
from notifier.cli.campaign_exports import failures
from notifier.cli.campaign_imports import audience, campaign_service, codes
from notifier.cli.output import Text
from notifier.cli.parsing import JSON_OBJECT
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
@click.option(
    "--audience",
    type=click.Choice(["addresses", "profiles"]),
    default="addresses",
    show_default=True,
    help="What the audience lists: recipients' addresses, or profiles' ids (each row then goes"
    " to its person's address when sent, with their preferences, quiet hours and caps).",
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
    audience: str,
) -> int:
    campaign_id = campaign_service().create(
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
        audience=audience,
    )
    output.emit(
        {"name": name, "id": campaign_id},
        Text(f"created campaign {output.quoted(name)} (id {campaign_id}); import an audience next"),
    )
    return 0


campaign.add_command(audience)
campaign.add_command(codes)


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
    campaigns = campaign_service()
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
    campaigns = campaign_service()
    progress = _watch(campaigns, name) if watch else campaigns.status(name)
    output.emit(_data(progress), Text(_summary(progress)))
    return 0


def _simple(verb: str, done: str, said: str, short: str, text: str) -> None:
    """``pause``, ``resume`` or ``cancel``: one call, one line saying how many rows it moved."""

    @campaign.command(verb, short_help=short, help=text)
    @_NAME
    @output.json_option
    def command(name: str) -> int:
        count = getattr(campaign_service(), verb)(name)
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
    paused = campaign_service().pause(name)
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

campaign.add_command(failures)


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
