"""The raw ceiling: notifier's claim and record statements alone, as fast as they go.

What it measures
    Plain loops, one process per core (2), each on one connection: claim a batch of 500 with
    ``notifier.db.queue.CLAIM_DUE`` (after ``CLAIM_PLAN``) and the parameters
    ``queue.claim_parameters`` gives (on the driver's cursor, as the dispatcher runs it),
    commit, record the rows sent with ``queue.record_outcomes`` (no worker named, so no attempt
    history), commit; until nothing is left. A freshly migrated database (notifier's table,
    indexes and trigger) holds ``--rows`` due ``null`` rows. No Celery, no sends, no Python
    ``Notification`` per row: the database's ceiling for notifier's own statements on this
    machine. Rows per second, from the start signal to the last loop done, with the time per
    batch of each statement and the CPU of the loops and their PostgreSQL backends.

    ``bench/end_to_end.py`` is measured against it: ``python bench/throughput.py --only 1,2``.

How to run it
    From the repository root, with PostgreSQL on localhost::

        python bench/ceiling.py [--rows N] [--million] [--keep]

    Its database ``notifier_bench_ceiling_<pid>`` (``NOTIFIER_BENCH_POSTGRES``, default
    ``postgresql://postgres@127.0.0.1:5432``) is dropped afterwards unless ``--keep``.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

# The repository first, and this folder off the path: its email.py would shadow the standard
# library's email package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

import psycopg

from bench import children, harness
from bench.common import load, sqlalchemy_url
from bench.drains import insert_due, status_counts
from bench.harness import BATCH, Bench, Line, Result, fmt_int
from notifier.db import queue
from notifier.db.engine import driver, make_engine
from notifier.models import AttemptOutcome, Decision

PROCESSES = 2  # one per core on the 2-core machine this was written for
LEASE_SECONDS = 300
OPTIONS = ("rows", "million", "keep")


def _raw_loop(
    url: str, batch: int, ready: Queue[Any], go: Event, results: Queue[Any]
) -> None:  # pragma: no cover - runs in a child process
    """Claim and record sent until nothing is left; report rows, finish time and time spent."""
    try:
        engine = make_engine(sqlalchemy_url(url))
        with engine.connect() as conn:
            worker = f"bench-raw:{os.getpid()}"
            limits = queue.ReadLimits()
            ready.put(os.getpid())
            go.wait()
            cpu = time.process_time()
            rows = batches = 0
            claim_s = record_s = 0.0
            while True:
                token = uuid.uuid4()
                t0 = time.perf_counter()
                params = queue.claim_parameters(token, worker, LEASE_SECONDS, batch, limits)
                with conn.begin(), driver(conn).cursor() as cur:
                    cur.execute(queue.CLAIM_PLAN)
                    ids = [int(r[0]) for r in cur.execute(queue.CLAIM_DUE, params).fetchall()]
                t1 = time.perf_counter()
                claim_s += t1 - t0
                if not ids:
                    break
                now = time.time()
                sent = [
                    Decision(
                        i,
                        "null",
                        AttemptOutcome.sent,
                        message_id=f"null-{i}",
                        provider="null",
                        sent_at=now,
                    )
                    for i in ids
                ]
                with conn.begin():
                    rows += queue.record_outcomes(conn, token, sent)
                record_s += time.perf_counter() - t1
                batches += 1
        engine.dispose()
        results.put(
            {
                "rows": rows,
                "batches": batches,
                "finished": time.time(),
                "cpu": time.process_time() - cpu,
                "claim_s": claim_s,
                "record_s": record_s,
            }
        )
    except BaseException as exc:  # report, don't hang the parent
        results.put({"error": f"{type(exc).__name__}: {exc}"})


def measure(bench: Bench) -> None:
    rows = bench.args.rows
    print(f"\n1. raw ceiling: claim + record sent, {PROCESSES} processes, batch {BATCH}")
    name, url = bench.database("ceiling")
    with psycopg.connect(url, autocommit=True) as conn:
        insert_s, _ = insert_due(conn, rows, "null", "bench")
        print(f"  inserted {rows:,} due rows in {insert_s:.1f}s", flush=True)
    started, reports, pg_cpu = children.run_children(
        _raw_loop, url, name, PROCESSES, BATCH, timeout=60 + rows / 500
    )
    with psycopg.connect(url) as conn:
        counts = status_counts(conn)
    bench.done_with(name)
    raw = Result(
        sum(r["rows"] for r in reports),
        max(r["finished"] for r in reports) - started,
        sum(r["cpu"] for r in reports),
        pg_cpu,
        connections=PROCESSES,
    )
    bench.found["ceiling"] = raw
    if counts.get("sent", 0) != rows:
        bench.notes.append(f"(1) not every row ended sent: {counts}")
    batches = sum(r["batches"] for r in reports)
    claim_ms = sum(r["claim_s"] for r in reports) / batches * 1000
    record_ms = sum(r["record_s"] for r in reports) / batches * 1000
    print(
        f"  {raw.rows:,} rows in {raw.seconds:.2f}s = {fmt_int(raw.rate)} rows/s;"
        f" {batches} batches, per batch: claim {claim_ms:.1f} ms, record {record_ms:.1f} ms"
        " (wall, per process)"
    )
    print(
        f"  CPU: client processes {raw.client_cpu:.1f}s, their PostgreSQL backends"
        f" {raw.postgres_cpu:.1f}s; load average {load()}"
    )
    bench.lines.append(
        Line(f"1 raw ceiling (claim+record, {PROCESSES} procs)", f"{fmt_int(raw.rate)} rows/s")
    )


def main(argv: list[str] | None = None) -> int:
    return harness.main(__doc__, "raw ceiling", harness.REDIS, OPTIONS, [measure], argv)


if __name__ == "__main__":
    sys.exit(main())
