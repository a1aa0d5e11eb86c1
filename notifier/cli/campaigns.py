"""``notifier campaign ...``: create, import, launch, watch, pause, resume and cancel campaigns."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from notifier import db
from notifier.campaigns import MOST_PARALLEL, PARALLEL, Campaigns, Progress


def add_parser(sub: Any) -> None:
    campaign = sub.add_parser("campaign", help="send one message to a large audience")
    commands = campaign.add_subparsers(dest="campaign_command", required=True)

    p = commands.add_parser("create", help="create a draft campaign")
    p.add_argument("name")
    p.add_argument("--channel", required=True)
    p.add_argument("--subject", help="template, e.g. 'Your code, {name}'")
    p.add_argument("--body", help="template, e.g. 'Use {code} before Friday.'")
    p.add_argument("--payload", type=json.loads, default={}, help="JSON object for every row")
    p.add_argument("--priority", type=int, default=-10, help="below 0 lets other rows go first")
    p.add_argument("--max-attempts", type=int, default=5)
    p.set_defaults(func=_create)

    p = commands.add_parser("audience", help="import recipients from a CSV file or a query")
    p.add_argument("name")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--csv", type=Path, help="CSV with a header; other columns are fields")
    source.add_argument("--query", help="SQL returning a 'recipient' column and any fields")
    p.add_argument("--recipient-column", default="recipient", help="CSV column of recipients")
    p.set_defaults(func=_audience)

    p = commands.add_parser("codes", help="add codes to the pool: from a file or generated")
    p.add_argument("name")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--file", type=Path, help="one code per line")
    source.add_argument("--generate", type=int, metavar="N", help="generate N random codes")
    p.add_argument("--length", type=int, default=12, help="length of generated codes")
    p.set_defaults(func=_codes)

    p = commands.add_parser("launch", help="write one notification per recipient (re-runnable)")
    p.add_argument("name")
    p.add_argument("--no-watch", action="store_true", help="return once the rows are written")
    p.add_argument(
        "--parallel",
        type=int,
        default=PARALLEL,
        help=f"chunks written at once, each on its own connection (default {PARALLEL})",
    )
    p.set_defaults(func=_launch)

    p = commands.add_parser("status", help="counts of the campaign's notifications")
    p.add_argument("name")
    p.add_argument("--watch", action="store_true", help="refresh until nothing is left to send")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_status)

    for verb, text in (
        ("pause", "stop sending now; resume continues"),
        ("resume", "continue a paused campaign"),
        ("cancel", "cancel every unsent notification of the campaign"),
    ):
        p = commands.add_parser(verb, help=text)
        p.add_argument("name")
        p.set_defaults(func=_simple, verb=verb)


def _campaigns() -> Campaigns:
    return Campaigns(db.engine())


def _create(args: argparse.Namespace) -> int:
    campaign_id = _campaigns().create(
        args.name,
        args.channel,
        subject=args.subject,
        body=args.body,
        payload=args.payload,
        priority=args.priority,
        max_attempts=args.max_attempts,
    )
    print(f"created campaign {args.name!r} (id {campaign_id}); import an audience next")
    return 0


def _audience(args: argparse.Namespace) -> int:
    if args.csv is not None:
        with args.csv.open(newline="", encoding="utf-8") as rows:
            added = _campaigns().import_audience(args.name, rows, args.recipient_column)
    else:
        added = _campaigns().audience_from_query(args.name, args.query)
    print(f"{added} recipients added")
    return 0


def _codes(args: argparse.Namespace) -> int:
    if args.file is not None:
        with args.file.open(encoding="utf-8") as lines:
            added = _campaigns().import_codes(args.name, (line.strip() for line in lines))
    else:
        added = _campaigns().generate_codes(args.name, args.generate, args.length)
    print(f"{added} codes added to the pool")
    return 0


def _launch(args: argparse.Namespace) -> int:
    campaigns = _campaigns()
    total = campaigns.status(args.name).counts.recipients
    written = 0
    started = time.monotonic()

    def progress(n: int) -> None:
        nonlocal written
        written += n
        _bar("writing", written, total, started)

    if not 1 <= args.parallel <= MOST_PARALLEL:
        raise SystemExit(f"--parallel takes 1 to {MOST_PARALLEL}")
    campaigns.launch(args.name, progress, parallel=args.parallel)
    _bar("writing", total, total, started, finished=True)
    if not args.no_watch:
        return _watch(campaigns, args.name)
    return 0


def _status(args: argparse.Namespace) -> int:
    campaigns = _campaigns()
    if args.watch:
        return _watch(campaigns, args.name)
    status = campaigns.status(args.name)
    if args.json:
        c = status.counts
        print(
            json.dumps(
                {
                    "name": status.campaign.name,
                    "status": status.campaign.status,
                    "recipients": c.recipients,
                    "codes": c.codes,
                    "codes_given": c.codes_given,
                    "enqueued": c.notifications,
                    "by_status": c.by_status,
                    "retrying": c.retrying,
                }
            )
        )
    else:
        print(_summary(status))
    return 0


def _simple(args: argparse.Namespace) -> int:
    campaigns = _campaigns()
    count = getattr(campaigns, args.verb)(args.name)
    done, said = {
        "pause": ("paused", "held back"),
        "resume": ("resumed", "released"),
        "cancel": ("cancelled", "cancelled"),
    }[args.verb]
    print(f"campaign {args.name!r}: {done}; {count} notifications {said}")
    return 0


def _watch(campaigns: Campaigns, name: str) -> int:
    started = time.monotonic()
    try:
        while True:
            status = campaigns.status(name)
            total = status.counts.notifications
            _bar("sending", total - status.unfinished, total, started, extra=_counts(status))
            if status.unfinished == 0 or status.campaign.status in ("paused", "cancelled"):
                break
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass  # stop watching; the campaign goes on
    print()
    print(_summary(campaigns.status(name)))
    return 0


def _counts(status: Progress) -> str:
    c = status.counts
    return (
        f"enqueued {c.notifications}  sent {status.sent}  retrying {c.retrying}  dead {status.dead}"
    )


def _summary(status: Progress) -> str:
    c = status.counts
    lines = [
        f"campaign {status.campaign.name!r} ({status.campaign.channel}): {status.campaign.status}",
        f"  recipients {c.recipients}   codes {c.codes} ({c.codes_given} given)",
        f"  {_counts(status)}"
        + "".join(
            f"  {s} {n}" for s, n in sorted(c.by_status.items()) if s not in ("sent", "dead")
        ),
    ]
    return "\n".join(lines)


def _bar(
    what: str, done: int, total: int, started: float, *, extra: str = "", finished: bool = False
) -> None:
    width = 30
    share = done / total if total else 1.0
    filled = int(width * share)
    rate = done / max(time.monotonic() - started, 1e-6)
    line = (
        f"\r{what} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}"
        f" {share:5.1%} {rate:,.0f}/s {extra}"
    )
    sys.stdout.write(line)
    sys.stdout.flush()
    if finished:
        sys.stdout.write("\n")
