"""``notifier stats``, ``show``, ``requeue``, ``cancel`` and ``purge``: the operators' commands.

Tables for people by default, ``--json`` for scripts. Exit status: 0 done; 1 nothing matched
(or, for ``show``, no such row; for ``cancel KEY``/``--id``, the row was not waiting); 2 bad
arguments; 3 the operator answered no to the confirmation, nothing changed.

``requeue`` and bulk ``cancel`` first count what matches; above ``--confirm-above`` rows (100)
they ask on stdin, unless ``--yes``. ``--dry-run`` only counts.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from notifier import client, db, logs, ops
from notifier.cli import terminal
from notifier.cli.parsing import parse_duration, parse_when, whole_number
from notifier.db import producers
from notifier.models import Status
from notifier.settings import get_settings

DECLINED = 3


def add_parsers(sub: Any) -> None:
    """Add the operators' subcommands to the ``notifier`` parser's subparsers."""

    def times(p: argparse.ArgumentParser, what: str) -> None:
        since = p.add_mutually_exclusive_group()
        since.add_argument("--since", type=parse_when, help=f"{what} at or after (ISO 8601)")
        since.add_argument(
            "--last", type=parse_duration, help=f"{what} in the last ..., e.g. 2h or 7d"
        )
        p.add_argument("--until", type=parse_when, help=f"{what} before (ISO 8601)")

    def bulk(p: argparse.ArgumentParser, verb: str) -> None:
        p.add_argument("--all", action="store_true", help=f"{verb} every row (no filter given)")
        p.add_argument("--dry-run", action="store_true", help="count what matches; change nothing")
        p.add_argument("--yes", action="store_true", help="do not ask, however many rows match")
        p.add_argument(
            "--confirm-above",
            type=int,
            default=100,
            metavar="N",
            help="ask on stdin when more than N rows match (default 100)",
        )
        p.add_argument("--batch-size", type=int, default=ops.BATCH_SIZE, help=argparse.SUPPRESS)
        p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("stats", help="rows by status and channel, lag, and recent throughput")
    p.add_argument(
        "--minutes",
        type=whole_number(1, 1440),
        default=5,
        help="whole minutes of throughput shown (at most 1440, a day)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_logged(_stats))

    p = sub.add_parser("show", help="one notification and its whole attempt history")
    p.add_argument("id", type=int)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_logged(_show))

    p = sub.add_parser(
        "requeue",
        help="send dead notifications again: back to pending, due now, attempts reset",
        description="Dead rows back to pending, due now, with their attempts reset to 0. "
        "Filters combine; times are when the rows died.",
    )
    p.add_argument("--id", type=int, action="append", default=[], help="this row (repeatable)")
    p.add_argument("--channel", action="append", default=[], help="this channel (repeatable)")
    times(p, "died")
    p.add_argument("--error", help="last_error contains this text (case ignored)")
    bulk(p, "requeue")
    p.set_defaults(func=_logged(_requeue))

    p = sub.add_parser(
        "cancel",
        help="cancel notifications that have not been sent yet",
        description="Cancel one row by its dedupe key or --id, or every unsent row matching "
        "the filters (times are when the rows were created).",
    )
    p.add_argument("key", nargs="?", help="the row's dedupe key")
    p.add_argument("--id", type=int, action="append", default=[], help="this row (repeatable)")
    p.add_argument("--reason", default="cancelled by operator", help="stored in last_error")
    p.add_argument("--channel", action="append", default=[], help="this channel (repeatable)")
    p.add_argument("--campaign", help="rows of this campaign (by name)")
    times(p, "created")
    p.add_argument(
        "--status",
        action="append",
        choices=[Status.pending.value, Status.processing.value],
        help="only rows in this status (repeatable; default both)",
    )
    bulk(p, "cancel")
    p.set_defaults(func=_logged(_cancel))

    p = sub.add_parser(
        "purge",
        help="delete finished rows past their retention, with their attempt history",
        description="Delete sent, dead and cancelled rows that finished longer ago than "
        "NOTIFIER_RETENTION_SENT_DAYS (30), _DEAD_DAYS (365) and _CANCELLED_DAYS (30), and "
        "their attempt history, in batches. Pending and processing rows are never touched.",
    )
    p.add_argument("--dry-run", action="store_true", help="count what would go; delete nothing")
    p.add_argument("--batch-size", type=int, default=ops.BATCH_SIZE, help="rows per transaction")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_logged(_purge))


def _logged(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``command``, run with logging set up as NOTIFIER_LOG_FORMAT says."""

    def run(args: argparse.Namespace) -> int:
        logs.configure(get_settings())
        return command(args)

    return run


# --- stats and show -------------------------------------------------------------------------------


def _stats(args: argparse.Namespace) -> int:
    stats = ops.stats(db.engine(), args.minutes)
    q = stats.queue
    if args.json:
        terminal.json_line(
            {
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
            }
        )
        return 0
    terminal.table(["STATUS", "CHANNEL", "COUNT"], [(s, c, n) for s, c, n in q.by_status_channel])
    print(f"\ndue now: {q.due}   lag (oldest due row waiting): {q.lag_seconds:.1f}s\n")
    terminal.table(
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
    )
    print(f"\nsent per minute: {stats.sent_per_minute:.1f} (mean of the whole minutes)")
    if not get_settings().record_attempts:
        print("(NOTIFIER_RECORD_ATTEMPTS is off: throughput comes from the attempt history)")
    return 0


def _show(args: argparse.Namespace) -> int:
    story = ops.show(db.engine(), args.id)
    if story is None:
        print(f"no notification {args.id}", file=sys.stderr)
        return 1
    if args.json:
        terminal.json_line({"notification": story.row, "attempts": story.attempts})
        return 0
    width = max(len(k) for k in story.row)
    print(f"notification {story.row['id']}")
    for key, value in story.row.items():
        if key != "id" and value is not None:
            print(f"  {key:<{width}}  {terminal.shown(value)}")
    print(f"\nattempts ({len(story.attempts)})")
    if story.attempts:
        terminal.table(
            ["#", "AT", "WORKER", "CHANNEL", "OUTCOME", "TOOK", "ERROR"],
            [
                (
                    a["attempt"],
                    terminal.shown(a["at"]),
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
    return 0


# --- requeue and cancel -------------------------------------------------------------------------


def _requeue(args: argparse.Namespace) -> int:
    _need_a_filter(
        args, args.id or args.channel or args.since or args.last or args.until or args.error
    )
    f = ops.DeadFilter(
        ids=args.id,
        channels=args.channel,
        since=_since(args),
        until=args.until,
        error=args.error,
    )
    engine = db.engine()
    count, snap = ops.count_requeue(engine, f)
    return _bulk(
        args,
        count,
        "dead notifications",
        "requeue",
        "requeued",
        lambda progress: ops.requeue(
            engine, f, snap, batch_size=args.batch_size, progress=progress
        ),
    )


def _cancel(args: argparse.Namespace) -> int:
    filters = bool(
        args.channel or args.campaign or args.since or args.last or args.until or args.status
    )
    if args.key is not None or args.id:
        if args.key is not None and args.id:
            raise ValueError("give a key or --id, not both")
        if filters or args.all or args.dry_run:
            raise ValueError("a key or --id cancels one row: leave out filters, --all, --dry-run")
        return _cancel_one(args)
    _need_a_filter(args, filters)
    f = ops.WaitingFilter(
        statuses=tuple(args.status or (Status.pending, Status.processing)),
        channels=args.channel,
        campaign=args.campaign,
        since=_since(args),
        until=args.until,
    )
    engine = db.engine()
    count, snap = ops.count_cancel(engine, f)
    return _bulk(
        args,
        count,
        "unsent notifications",
        "cancel",
        "cancelled",
        lambda progress: ops.cancel(
            engine, f, snap, args.reason, batch_size=args.batch_size, progress=progress
        ),
    )


def _cancel_one(args: argparse.Namespace) -> int:
    """Cancel the row with this key, or each row of ``--id``; 1 if any was not waiting."""
    reason = args.reason
    outcomes: list[tuple[str, bool]] = []
    with db.engine().begin() as conn:
        if args.id:
            for row_id in dict.fromkeys(args.id):
                done = producers.cancel_by_id(conn, row_id, reason)
                outcomes.append((f"notification {row_id}", done))
        else:
            done = client.cancel(conn, args.key, reason)
            outcomes.append((f"the notification with key {terminal.shown(repr(args.key))}", done))
    for what, done in outcomes:
        if done:
            print(f"cancelled {what}")
        else:
            print(f"{what} was not waiting to be sent (no such row, or already finished)")
    return 0 if all(done for _, done in outcomes) else 1


def _need_a_filter(args: argparse.Namespace, given: object) -> None:
    if not given and not args.all:
        raise ValueError(
            f"no filter given: name the rows to {args.command} "
            "(see --help), or pass --all to mean every one"
        )


def _since(args: argparse.Namespace) -> datetime | None:
    last: timedelta | None = args.last
    since: datetime | None = args.since
    return since if last is None else datetime.now(UTC) - last


def _bulk(
    args: argparse.Namespace,
    count: int,
    rows: str,
    verb: str,
    done: str,
    apply: Callable[[ops.Progress | None], ops.Change],
) -> int:
    """Confirm, apply and report a counted bulk change."""
    result: dict[str, Any] = {"matched": count, done: 0, "left": 0, "dry_run": args.dry_run}
    status = 0
    if count == 0:
        message, status = f"no {rows} match; nothing {done}", 1
    elif args.dry_run:
        message = f"{count} {rows} match; nothing {done} (dry run)"
    elif not _confirmed(args, count, f"{verb} {count} {rows}?"):
        message, status = f"not confirmed; nothing {done} (--yes skips the question)", DECLINED
        result["confirmed"] = False
    else:
        change = apply(_progress(done) if sys.stderr.isatty() and not args.json else None)
        result.update({done: change.changed, "left": change.left})
        message = f"{done} {change.changed} {rows}"
        if change.left:
            message += f"; {change.left} were held by a worker each time: run it again"
    if args.json:
        terminal.json_line(result)
    else:
        print(message)
    return status


def _confirmed(args: argparse.Namespace, count: int, question: str) -> bool:
    if args.yes or count <= args.confirm_above:
        return True
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline()
    if not answer.endswith("\n"):
        print(file=sys.stderr)
    return answer.strip().lower() in ("y", "yes")


def _progress(done: str) -> ops.Progress:
    def show(n: int) -> None:
        print(f"\r{done} {n}...", end="", file=sys.stderr, flush=True)

    return show


# --- purge ----------------------------------------------------------------------------------------


def _purge(args: argparse.Namespace) -> int:
    settings = get_settings()
    report = ops.purge(
        db.engine(),
        settings,
        dry_run=args.dry_run,
        batch_size=args.batch_size,
        progress=_progress("deleted") if sys.stderr.isatty() and not args.json else None,
    )
    if args.json:
        terminal.json_line(
            {
                "dry_run": report.dry_run,
                "deleted": report.deleted,
                "attempts": report.attempts,
                "before": {s: at.isoformat() for s, at in report.before.items()},
            }
        )
        return 0
    if sys.stderr.isatty() and not report.dry_run:
        print(file=sys.stderr)
    terminal.table(
        ["STATUS", "FINISHED BEFORE", "WOULD DELETE" if report.dry_run else "DELETED"],
        [
            (s, report.before[s].astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC"), n)
            for s, n in report.deleted.items()
        ]
        + [("(attempts)", "", report.attempts)],
    )
    return 0
