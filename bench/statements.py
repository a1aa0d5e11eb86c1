"""Where PostgreSQL's time goes, statement by statement, as a long drain goes on.

What it measures
    One process on one connection drains ``--rows`` due ``null`` rows (default 1,000,000) of a
    freshly migrated database with the dispatcher's own statements, in the dispatcher's order:
    ``queue.claim_due`` (with ``CLAIM_PLAN``) of ``--batch`` rows (default 1,000, the default
    ``NOTIFIER_MAX_BATCH_SIZE``), ``queue.recheck`` of them, and ``queue.record_outcomes`` of
    them all sent, with their attempts appended to the history; each in a transaction of its
    own. No sends, no Celery. For every tenth of the drain it prints the CPU each statement
    cost the PostgreSQL backend per row (from ``/proc/<pid>/schedstat``, nanoseconds) and the
    client's CPU per row. A statement whose cost grows from one tenth to the next is reading
    entries that the rows already drained left behind (until a vacuum) - the claim's walk of
    ``notifications_due`` does, by design; nothing else should.

    The rows are inserted in one statement and not analyzed, as after a producer's or a
    campaign's bulk INSERT: the first tenth shows what the claim costs before any ANALYZE.

How to run it
    From the repository root, with PostgreSQL on localhost::

        python bench/statements.py [--rows N] [--batch N] [--keep]

    Its database ``notifier_bench_statements_<pid>`` (``NOTIFIER_BENCH_POSTGRES``, default
    ``postgresql://postgres@127.0.0.1:5432``) is dropped afterwards unless ``--keep``.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

# The repository first, and this folder off the path: its email.py would shadow the standard
# library's email package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

import psycopg
from sqlalchemy import text

from bench import harness
from bench.common import run_interruptibly, sqlalchemy_url
from bench.drains import insert_due, status_counts
from bench.harness import Bench, Line, fmt_int, positive
from notifier.db import queue
from notifier.db.engine import make_engine
from notifier.models import AttemptOutcome, Decision
from notifier.settings import Settings

OPTIONS = ("rows", "keep")
SEGMENTS = 10
STATEMENTS = ("claim", "recheck", "record")
T = TypeVar("T")


def backend_ns(pid: int) -> int:
    """CPU time the backend ``pid`` has had so far, in nanoseconds."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def measure(bench: Bench) -> None:
    rows, batch = bench.args.rows, bench.args.batch
    print(f"\n1. statements: {rows:,} rows, batches of {batch:,}, one process")
    name, url = bench.database("statements")
    with psycopg.connect(url, autocommit=True) as conn:
        insert_s, _ = insert_due(conn, rows, "null", "bench")
    print(f"  inserted {rows:,} due rows in {insert_s:.1f}s (not analyzed)", flush=True)
    engine = make_engine(sqlalchemy_url(url))
    segment = max(rows // SEGMENTS, 1)
    spent = dict.fromkeys(STATEMENTS, 0)
    done = since = 0
    client = time.process_time()
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    with engine.connect() as db:
        pid = int(db.execute(text("SELECT pg_backend_pid()")).scalar_one())
        db.commit()

        def timed(statement: str, work: Callable[..., T], *args: object, **kwargs: object) -> T:
            before = backend_ns(pid)
            with db.begin():
                result = work(db, *args, **kwargs)
            spent[statement] += backend_ns(pid) - before
            return result

        print(f"  {'rows done':>12}  " + "  ".join(f"{s:>8}" for s in STATEMENTS) + "    client")
        while True:
            token = uuid.uuid4()
            claimed = timed(
                "claim", queue.claim_due, limit=batch, lease_seconds=300, token=token, worker="b"
            )
            if not claimed:
                break
            ids = [n.id for n in claimed]
            timed("recheck", queue.recheck, token, ids)
            now = time.time()
            sent = [
                Decision(i, "null", AttemptOutcome.sent, provider="null", sent_at=now) for i in ids
            ]
            timed("record", queue.record_outcomes, token, sent, "b")
            done += len(ids)
            if done - since >= segment or len(claimed) < batch:
                per_row = {s: spent[s] / 1000 / (done - since) for s in STATEMENTS}
                cpu = (time.process_time() - client) * 1e6 / (done - since)
                print(
                    f"  {done:>12,}  "
                    + "  ".join(f"{per_row[s]:>5.1f} us" for s in STATEMENTS)
                    + f"  {cpu:>5.1f} us",
                    flush=True,
                )
                first = first or per_row
                last = per_row
                spent = dict.fromkeys(STATEMENTS, 0)
                since, client = done, time.process_time()
    engine.dispose()
    with psycopg.connect(url) as conn:
        counts = status_counts(conn)
    bench.done_with(name)
    if counts.get("sent", 0) != rows:
        bench.notes.append(f"(1) not every row ended sent: {counts}")
    for statement in STATEMENTS:
        if first:
            bench.lines.append(
                Line(
                    f"1 {statement}, PostgreSQL CPU a row",
                    f"{first[statement]:.1f} -> {last[statement]:.1f} us",
                )
            )
    bench.lines.append(Line("1 rows drained", fmt_int(done)))


def main(argv: list[str] | None = None) -> int:
    made = harness.parser(__doc__, OPTIONS)
    made.set_defaults(rows=1_000_000)
    made.add_argument(
        "--batch",
        type=positive,
        default=Settings.model_fields["max_batch_size"].default,
        help="rows a claim takes (default: NOTIFIER_MAX_BATCH_SIZE's default)",
    )
    args: argparse.Namespace = harness.parse(made, argv)
    return run_interruptibly(lambda a: harness.run("statements", harness.REDIS, a, [measure]), args)


if __name__ == "__main__":
    sys.exit(main())
