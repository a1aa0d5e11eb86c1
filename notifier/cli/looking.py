"""``notifier stats`` and ``notifier show``: what the queue is doing, and one row's story.

Tables for people by default, ``--json`` for scripts. Exit status: 0 done; 1 (``show``) no such
row; 2 bad arguments.
"""

from __future__ import annotations

from datetime import UTC

import click

from notifier import db, ops
from notifier.cli import output
from notifier.cli.base import NOTHING_MATCHED, Command
from notifier.cli.output import Fields, Table, Text
from notifier.cli.parsing import Parsed, whole_number
from notifier.delivery.ratelimit import ProviderRate, rates, utc_now
from notifier.settings import get_settings


@click.command(
    cls=Command,
    short_help="Rows by status and channel, the lag, and recent throughput.",
    help="Rows by status and channel, how many are due and how long the oldest due row has"
    " waited (the lag), then sends, retries and deaths per minute over the last --minutes,"
    " and each rate-limited provider's limits today (a warm-up's day and today's rate)."
    "\n\nExample: notifier stats --minutes 60",
)
@click.option(
    "--minutes",
    type=Parsed("minutes", whole_number(1, 1440)),
    default=5,
    metavar="N",
    help="Whole minutes of throughput to show, 1 to 1440 (a day).",
)
@output.json_option
def stats(minutes: int) -> int:
    stats = ops.stats(db.engine(), minutes)
    settings = get_settings()
    limited = rates(settings.rate_limits, settings.rate_warmup, utc_now())
    q = stats.queue
    data = {
        "by_status_channel": [
            {"status": s, "channel": c, "count": n} for s, c, n in q.by_status_channel
        ],
        "due": q.due,
        "lag_seconds": q.lag_seconds,
        "sent_per_minute": stats.sent_per_minute,
        "throughput": [
            {
                "minute": m.start.isoformat(),
                "sent": m.sent,
                "retry": m.retry,
                "dead": m.dead,
                "partial": m.partial,
            }
            for m in stats.minutes
        ],
        "status_events": {
            "pending": stats.status_events.pending,
            "processing": stats.status_events.processing,
            "dead": stats.status_events.dead,
            "oldest_pending_seconds": stats.status_events.oldest_pending_seconds,
        },
        "rate_limits": [_rate_json(r) for r in limited],
    }
    blocks: list[output.Block] = [
        Table(["STATUS", "CHANNEL", "COUNT"], [(s, c, n) for s, c, n in q.by_status_channel]),
        Text(f"\ndue now: {q.due}   lag (oldest due row waiting): {q.lag_seconds:.1f}s\n"),
        Table(
            ["MINUTE (UTC)", "SENT", "RETRY", "DEAD"],
            [
                (
                    m.start.astimezone(UTC).strftime("%H:%M") + (" (so far)" if m.partial else ""),
                    m.sent,
                    m.retry,
                    m.dead,
                )
                for m in stats.minutes
            ],
        ),
        Text(f"\nsent per minute: {stats.sent_per_minute:.1f} (mean of the whole minutes)"),
    ]
    events = stats.status_events
    if events.pending or events.processing or events.dead:
        blocks.append(
            Text(
                f"status webhook events: {events.pending} pending (oldest"
                f" {events.oldest_pending_seconds:.0f}s), {events.processing} sending,"
                f" {events.dead} dead"
            )
        )
    if limited:
        blocks.append(Text("\nrate limits (UTC day):"))
        blocks.append(
            Table(
                ["PROVIDER", "LIMITS TODAY", "WARM-UP"],
                [
                    (
                        r.provider,
                        ", ".join(r.current),
                        r.warmup.describe(r.today) if r.warmup else "",
                    )
                    for r in limited
                ],
            )
        )
    if not settings.record_attempts:
        blocks.append(
            Text("(NOTIFIER_RECORD_ATTEMPTS is off: throughput comes from the attempt history)")
        )
    output.emit(data, *blocks)
    return 0


def _rate_json(rate: ProviderRate) -> dict[str, object]:
    w = rate.warmup
    return {
        "provider": rate.provider,
        "limits": rate.current,
        "warmup": None
        if w is None
        else {
            "spec": w.spelling,
            "first_day": w.first_day.isoformat(),
            "day": w.day(rate.today),
            "rate_today": w.rate_on(rate.today),
            "ceiling": w.ceiling.spelling,
        },
    }


@click.command(
    cls=Command,
    short_help="One notification and its whole attempt history.",
    help="One notification (every column that is set) and its attempt history, oldest first."
    " Exit status 1 if there is no such row.\n\nExample: notifier show 1042",
)
@click.argument("notification_id", metavar="ID", type=int)
@output.json_option
def show(notification_id: int) -> int:
    story = ops.show(db.engine(), notification_id)
    if story is None:
        output.note(f"no notification {notification_id}")
        return NOTHING_MATCHED
    blocks: list[output.Block] = [
        Fields(
            [(k, v) for k, v in story.row.items() if k != "id" and v is not None],
            title=f"notification {story.row['id']}",
        ),
        Text(f"\nattempts ({len(story.attempts)})"),
    ]
    if story.attempts:
        blocks.append(
            Table(
                ["#", "AT", "WORKER", "CHANNEL", "OUTCOME", "TOOK", "ERROR"],
                [
                    (
                        a["attempt"],
                        a["at"],
                        a["worker"],
                        a["channel"],
                        a["outcome"],
                        "" if a["duration_ms"] is None else f"{a['duration_ms']} ms",
                        a["error"] or "",
                    )
                    for a in story.attempts
                ],
                indent="  ",
            )
        )
    output.emit({"notification": story.row, "attempts": story.attempts}, *blocks)
    return 0


COMMANDS = (stats, show)
