"""``notifier requeue``, ``cancel`` and ``purge``: the operators' changes to many rows at once.

Tables for people by default, ``--json`` for scripts. Exit status: 0 done; 1 nothing matched
(or, for ``cancel KEY``/``--id``, the row was not waiting); 2 bad arguments; 3 the operator
answered no to the confirmation, nothing changed.

``requeue`` and bulk ``cancel`` first count what matches; above ``--confirm-above`` rows (100)
they ask on stdin, unless ``--yes``. ``--dry-run`` only counts.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import click

from notifier import client, db, ops
from notifier.cli import output
from notifier.cli.base import DECLINED, NOTHING_MATCHED, Command, exclusive
from notifier.cli.output import Table, Text
from notifier.cli.parsing import DURATION, TIME
from notifier.db import producers
from notifier.models import Status
from notifier.settings import get_settings

F = TypeVar("F", bound=Callable[..., Any])


def _times(what: str) -> Callable[[F], F]:
    """``--since``/``--last`` and ``--until``: the rows' ``what`` time."""

    def add(command: F) -> F:
        for option in reversed(
            (
                click.option(
                    "--since",
                    type=TIME,
                    metavar="TIME",
                    help=f"Only rows {what} at or after this ISO 8601 time, e.g."
                    " 2026-11-29T10:00:00Z (UTC without a zone).",
                ),
                click.option(
                    "--last",
                    type=DURATION,
                    metavar="DURATION",
                    help=f"Only rows {what} in the last DURATION: a number and s, m, h or d,"
                    " e.g. 2h or 7d (at most 3650d). Instead of --since.",
                ),
                click.option(
                    "--until",
                    type=TIME,
                    metavar="TIME",
                    help=f"Only rows {what} before this ISO 8601 time.",
                ),
            )
        ):
            command = option(command)
        return command

    return add


def _bulk(verb: str) -> Callable[[F], F]:
    """The options of a counted bulk change: ``--all``, ``--dry-run``, ``--yes``, ..."""

    def add(command: F) -> F:
        for option in reversed(
            (
                click.option(
                    "--all",
                    "every",
                    is_flag=True,
                    help=f"{verb.capitalize()} every matching row; needed when no filter is"
                    " given, so a bare command never touches the whole table.",
                ),
                click.option(
                    "--dry-run", is_flag=True, help="Only count what matches; change nothing."
                ),
                click.option(
                    "--yes",
                    is_flag=True,
                    help="Do not ask for confirmation, however many rows match.",
                ),
                click.option(
                    "--confirm-above",
                    type=click.IntRange(min=0),
                    default=100,
                    metavar="N",
                    help="Ask on stdin (y/N) before changing more than N rows.",
                ),
                click.option(
                    "--batch-size",
                    type=click.IntRange(min=1),
                    default=ops.BATCH_SIZE,
                    hidden=True,
                    help="Rows per transaction.",
                ),
                output.json_option,
            )
        ):
            command = option(command)
        return command

    return add


_ID = click.option(
    "--id",
    "ids",
    type=int,
    multiple=True,
    metavar="ID",
    help="This notification, by its id (repeatable: --id 1 --id 2).",
)
_CHANNEL = click.option(
    "--channel",
    "channels",
    multiple=True,
    metavar="CHANNEL",
    help="Only rows of this channel, e.g. email (repeatable).",
)
_CAMPAIGN = click.option(
    "--campaign", metavar="NAME", help="Only rows of this campaign, by its name."
)


# --- requeue and cancel -------------------------------------------------------------------------


@click.command(
    cls=Command,
    short_help="Send dead notifications again (back to pending, due now).",
    help="Dead rows back to pending, due now, with their attempts reset to 0 (last_error is"
    " kept). Filters combine; times are when the rows died. Works in batches of 5,000 rows,"
    " each its own transaction.\n\n"
    "Exit status: 0 done, 1 nothing matched, 2 bad arguments (or no such campaign), 3 not"
    " confirmed.\n\n"
    "\b\nExamples:\n"
    '  notifier requeue --channel email --last 2h --error "451"\n'
    "  notifier requeue --id 1042 --id 1043 --yes\n"
    "  notifier requeue --campaign spring --yes\n"
    "  notifier requeue --all --dry-run",
)
@_ID
@_CHANNEL
@_CAMPAIGN
@_times("that died")
@click.option(
    "--error",
    metavar="TEXT",
    help="Only rows whose last_error contains TEXT (case ignored), e.g. 451.",
)
@_bulk("requeue")
def requeue(
    ids: tuple[int, ...],
    channels: tuple[str, ...],
    campaign: str | None,
    since: datetime | None,
    last: timedelta | None,
    until: datetime | None,
    error: str | None,
    **bulk: Any,
) -> int:
    ctx = click.get_current_context()
    exclusive(ctx, "since", "last")
    given = ids or channels or campaign or since or last or until or error
    _need_a_filter("requeue", bulk, given)
    f = ops.DeadFilter(
        ids=list(ids),
        channels=list(channels),
        campaign=campaign,
        since=_since(since, last),
        until=until,
        error=error,
    )
    engine = db.engine()
    count, snap = ops.count_requeue(engine, f)
    return _change(
        bulk,
        count,
        "dead notifications",
        "requeue",
        "requeued",
        lambda progress: ops.requeue(
            engine, f, snap, batch_size=bulk["batch_size"], progress=progress
        ),
    )


@click.command(
    cls=Command,
    short_help="Cancel notifications that have not been sent yet.",
    help="Cancel one row by its dedupe KEY or by --id (repeatable), or every unsent row"
    " matching the filters (times are when the rows were created). The reason goes to"
    " last_error.\n\n"
    "Exit status: 0 done; 1 a row named by KEY or --id was not waiting to be sent (no such"
    " row, or already finished), or no row matched the filters; 3 not confirmed.\n\n"
    "\b\nExamples:\n"
    '  notifier cancel signup-reminder:42 --reason "user confirmed"\n'
    "  notifier cancel --id 1042 --id 1043\n"
    "  notifier cancel --channel sms --status pending --since 2026-11-29T10:00:00Z --yes",
)
@click.argument("key", required=False)
@_ID
@click.option(
    "--reason",
    default="cancelled by operator",
    metavar="TEXT",
    help="Why, stored in each cancelled row's last_error.",
)
@_CHANNEL
@_CAMPAIGN
@_times("created")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice([Status.pending.value, Status.processing.value]),
    help="Only rows in this status (repeatable; default both).",
)
@_bulk("cancel")
def cancel(
    key: str | None,
    ids: tuple[int, ...],
    reason: str,
    channels: tuple[str, ...],
    campaign: str | None,
    since: datetime | None,
    last: timedelta | None,
    until: datetime | None,
    statuses: tuple[str, ...],
    **bulk: Any,
) -> int:
    ctx = click.get_current_context()
    exclusive(ctx, "since", "last")
    filters = bool(channels or campaign or since or last or until or statuses)
    if key is not None or ids:
        if key is not None and ids:
            raise ValueError("give a key or --id, not both")
        if filters or bulk["every"] or bulk["dry_run"]:
            raise ValueError("a key or --id cancels one row: leave out filters, --all, --dry-run")
        return _cancel_one(key, ids, reason)
    _need_a_filter("cancel", bulk, filters)
    f = ops.WaitingFilter(
        statuses=tuple(statuses or (Status.pending, Status.processing)),
        channels=list(channels),
        campaign=campaign,
        since=_since(since, last),
        until=until,
    )
    engine = db.engine()
    count, snap = ops.count_cancel(engine, f)
    return _change(
        bulk,
        count,
        "unsent notifications",
        "cancel",
        "cancelled",
        lambda progress: ops.cancel(
            engine, f, snap, reason, batch_size=bulk["batch_size"], progress=progress
        ),
    )


def _cancel_one(key: str | None, ids: tuple[int, ...], reason: str) -> int:
    """Cancel the row with this key, or each row of ``--id``; 1 if any was not waiting."""
    outcomes: list[tuple[dict[str, object], str, bool]] = []
    with db.engine().begin() as conn:
        if ids:
            for row_id in dict.fromkeys(ids):
                done = producers.cancel_by_id(conn, row_id, reason)
                outcomes.append(({"id": row_id}, f"notification {row_id}", done))
        else:
            assert key is not None
            done = client.cancel(conn, key, reason)
            what = f"the notification with key {output.quoted(key)}"
            outcomes.append(({"key": key}, what, done))
    lines = [
        f"cancelled {what}"
        if done
        else f"{what} was not waiting to be sent (no such row, or already finished)"
        for _, what, done in outcomes
    ]
    output.emit(
        [{**row, "cancelled": done} for row, _, done in outcomes],
        Text("\n".join(lines)),
    )
    return 0 if all(done for _, _, done in outcomes) else NOTHING_MATCHED


def _need_a_filter(verb: str, bulk: dict[str, Any], given: object) -> None:
    if not given and not bulk["every"]:
        raise ValueError(
            f"no filter given: name the rows to {verb} (see --help), or pass --all to mean"
            " every one"
        )


def _since(since: datetime | None, last: timedelta | None) -> datetime | None:
    return since if last is None else datetime.now(UTC) - last


def _change(
    bulk: dict[str, Any],
    count: int,
    rows: str,
    verb: str,
    done: str,
    apply: Callable[[ops.Progress | None], ops.Change],
) -> int:
    """Confirm, apply and report a counted bulk change."""
    dry_run = bool(bulk["dry_run"])
    result: dict[str, Any] = {"matched": count, done: 0, "left": 0, "dry_run": dry_run}
    status = 0
    if count == 0:
        message, status = f"no {rows} match; nothing {done}", NOTHING_MATCHED
    elif dry_run:
        message = f"{count} {rows} match; nothing {done} (dry run)"
    elif not (bulk["yes"] or count <= bulk["confirm_above"]) and not output.confirm(
        f"{verb} {count} {rows}?"
    ):
        message, status = f"not confirmed; nothing {done} (--yes skips the question)", DECLINED
        result["confirmed"] = False
    else:
        with output.progress(done, count) as bar:
            change = apply(bar.show if bar.shown else None)
        result.update({done: change.changed, "left": change.left})
        message = f"{done} {change.changed} {rows}"
        if change.left:
            message += f"; {change.left} were held by a worker each time: run it again"
    output.emit(result, Text(message))
    return status


# --- purge ----------------------------------------------------------------------------------------


@click.command(
    cls=Command,
    short_help="Delete finished rows past their retention, and old weeks of history.",
    help="Delete sent, dead and cancelled rows that finished longer ago than"
    " NOTIFIER_RETENTION_SENT_DAYS (30), NOTIFIER_RETENTION_DEAD_DAYS (365) and"
    " NOTIFIER_RETENTION_CANCELLED_DAYS (30), in batches, each its own transaction; then drop"
    " the weeks of attempt history older than NOTIFIER_RETENTION_HISTORY_DAYS (90), a week at"
    " a time, and make the weeks ahead. Pending and processing rows are never touched. Beat"
    " also runs this daily at 03:17 UTC.\n\nExample: notifier purge --dry-run",
)
@click.option("--dry-run", is_flag=True, help="Only count what would be deleted; delete nothing.")
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=ops.BATCH_SIZE,
    metavar="N",
    help="Rows deleted per transaction.",
)
@output.json_option
def purge(dry_run: bool, batch_size: int) -> int:
    settings = get_settings()
    with output.progress("deleted", drawn=not dry_run) as bar:
        report = ops.purge(
            db.engine(),
            settings,
            dry_run=dry_run,
            batch_size=batch_size,
            progress=bar.show if bar.shown else None,
        )
    output.emit(
        {
            "dry_run": report.dry_run,
            "deleted": report.deleted,
            "attempts": report.attempts,
            "before": {s: at.isoformat() for s, at in report.before.items()},
        },
        Table(
            ["STATUS", "FINISHED BEFORE", "WOULD DELETE" if report.dry_run else "DELETED"],
            [
                (s, report.before[s].astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC"), n)
                for s, n in report.deleted.items()
            ]
            + [("(attempts)", "", report.attempts)],
        ),
    )
    return 0


COMMANDS = (requeue, cancel, purge)
