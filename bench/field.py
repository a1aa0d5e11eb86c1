"""notifier against the field, measured side by side in one run on this machine.

What it measures
    Each round drains ``--rows`` due rows (default 100,000) three ways, one after the other,
    each in a scratch database of its own (dropped right after it unless ``--keep``):

    a. **Minimal table**: a table with only ``id``, ``status``, a due time and a partial index
       on the pending rows; ``--processes`` plain psycopg loops (default 2) claim ``--batch``
       rows (default 500) with ``UPDATE ... RETURNING`` over a ``FOR UPDATE SKIP LOCKED``
       sub-select, commit, mark them done with one ``UPDATE ... WHERE id = ANY(...)``, commit.
       The database's ceiling for claim + mark on this machine. Time from the start signal to
       the last loop done.
    b. **PgQueuer** (``pip install -e '.[bench]'``): its schema installed with its own
       installer (``Queries.install()``), the rows enqueued with ``Queries.enqueue`` (payload
       ``None``), drained by ``--processes`` processes, each a ``QueueManager`` with one
       entrypoint that does nothing, run as ``pgq run`` runs it (uvloop, asyncpg: its
       quick start's driver) with ``batch_size=--batch``, ``mode=drain`` and its other
       defaults (no concurrency cap). Time from the start signal to the last job logged done
       (``max(pgqueuer_log.created)``).
    c. **notifier end to end**, with notifier's DEFAULT settings (no ``NOTIFIER_*`` but the
       URLs): ``celery -A notifier worker --concurrency=--processes`` and beat, ready, then
       ``--rows`` due ``null`` rows INSERTed in one statement and drained. Time from the
       INSERT's commit to the last row recorded ``sent`` (its ``updated_at``), as
       ``bench/end_to_end.py``. ``--set NAME=VALUE`` (repeatable) gives the
       worker a ``NOTIFIER_<NAME>`` setting, e.g. ``--set BATCH_SIZE=500``, to see what a
       change of default would do; the targets are for the defaults.

    Each of (a), (b), (c) runs ``--repeat`` times (default 3), interleaved a, b, c, a, b, c...
    so that other load on the machine falls on all three alike; the median of each is
    reported, and notifier's ratio to (a) and to (b).

    With ``--scaling 1,2,4`` it measures instead (c) alone with each number of worker processes
    (``--repeat`` times each, interleaved), with the CPU each row costs in the worker
    processes, their PostgreSQL backends and Redis, and the connections open during the drain.

Targets
    notifier >= 0.6 x (a) and >= 1.25 x (b), on the medians. The exit status is 0 whether they
    are met or not; 1 if the set-up fails; 130 when interrupted.

How to run it
    From the repository root, with PostgreSQL and Redis on localhost::

        pip install -e '.[bench]'
        python bench/field.py [--rows N] [--batch N] [--processes N] [--repeat N]
                              [--set NAME=VALUE] [--keep]
        python bench/field.py --scaling 1,2,4

    Databases ``notifier_bench_field_<a|b|c>_<pid>`` on ``NOTIFIER_BENCH_POSTGRES`` (default
    ``postgresql://postgres@127.0.0.1:5432``); a Redis server of its own on a free loopback port
    (or the one ``NOTIFIER_BENCH_FIELD_REDIS`` names, whose database is flushed before each
    drain of (c) and at the end). Every process started is stopped on exit, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

# The repository first, and this folder off the path: its email.py would shadow the standard
# library's email package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

import psycopg

from bench import children, harness
from bench.common import SetupError, load, run_interruptibly
from bench.drains import drain, workers
from bench.harness import Bench, Result, describe_settings, ratio_line
from notifier.settings import Settings

REDIS = os.environ.get("NOTIFIER_BENCH_FIELD_REDIS")
#: notifier end to end must reach these shares of (a) and (b).
TARGET_CEILING = 0.6
TARGET_PGQUEUER = 1.25

MINIMAL_SCHEMA = """
CREATE TABLE queue (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    status text NOT NULL DEFAULT 'pending',
    due_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX queue_due ON queue (due_at, id) WHERE status = 'pending';
"""
MINIMAL_CLAIM = """
UPDATE queue AS q SET status = 'processing'
  FROM (SELECT id FROM queue WHERE status = 'pending' AND due_at <= now()
         ORDER BY due_at, id LIMIT %s FOR UPDATE SKIP LOCKED) AS due
 WHERE q.id = due.id
RETURNING q.id
"""
MINIMAL_DONE = "UPDATE queue SET status = 'done' WHERE id = ANY(%s)"
PGQUEUER_ENTRYPOINT = "null"
PGQUEUER_ENQUEUE_CHUNK = 10_000


# --- child processes ---------------------------------------------------------------------------


def _minimal_loop(
    url: str, batch: int, ready: Queue[Any], go: Event, results: Queue[Any]
) -> None:  # pragma: no cover - runs in a child process
    """(a): claim and mark done until nothing is left."""
    try:
        with psycopg.connect(url, application_name="bench-field-minimal") as conn:
            ready.put(os.getpid())
            go.wait()
            cpu = time.process_time()
            rows = 0
            while True:
                ids = [r[0] for r in conn.execute(MINIMAL_CLAIM, (batch,)).fetchall()]
                conn.commit()
                if not ids:
                    break
                conn.execute(MINIMAL_DONE, (ids,))
                conn.commit()
                rows += len(ids)
        results.put({"rows": rows, "finished": time.time(), "cpu": time.process_time() - cpu})
    except BaseException as exc:  # report, don't hang the parent
        results.put({"error": f"{type(exc).__name__}: {exc}"})


def _pgqueuer_worker(
    url: str, batch: int, ready: Queue[Any], go: Event, results: Queue[Any]
) -> None:  # pragma: no cover - runs in a child process
    """(b): one PgQueuer QueueManager in drain mode, as ``pgq run`` runs it (uvloop)."""
    import asyncpg  # type: ignore[import-untyped]
    import uvloop
    from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager
    from pgqueuer.domain.types import QueueExecutionMode

    async def main() -> None:
        conn = await asyncpg.connect(
            url, server_settings={"application_name": "bench-field-pgqueuer"}
        )
        manager = QueueManager(Queries(AsyncpgDriver(conn)))

        @manager.entrypoint(PGQUEUER_ENTRYPOINT)
        async def handle(job: Job) -> None:
            return None

        ready.put(os.getpid())
        await asyncio.to_thread(go.wait)
        cpu = time.process_time()
        # dequeue_timeout: how long an idle manager waits for a NOTIFY before it looks again;
        # 1 s instead of 30 s only shortens the wait once the queue is empty.
        await manager.run(
            batch_size=batch, mode=QueueExecutionMode.drain, dequeue_timeout=timedelta(seconds=1)
        )
        results.put({"finished": time.time(), "cpu": time.process_time() - cpu})

    try:
        uvloop.run(main())
    except BaseException as exc:
        results.put({"error": f"{type(exc).__name__}: {exc}"})


# --- the three drains --------------------------------------------------------------------------


def minimal(bench: Bench) -> Result:
    """(a): the minimal table drained by plain loops."""
    args = bench.args
    name, url = bench.scratch("field_a")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(MINIMAL_SCHEMA)
        conn.execute(
            "INSERT INTO queue (status) SELECT 'pending' FROM generate_series(1, %s)", [args.rows]
        )
        conn.execute("VACUUM ANALYZE queue")
    started, reports, pg_cpu = children.run_children(
        _minimal_loop, url, name, args.processes, args.batch
    )
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FILTER (WHERE status = 'done') FROM queue").fetchone()
    bench.done_with(name)
    done = int(row[0]) if row else 0
    if done != args.rows or sum(r["rows"] for r in reports) != args.rows:
        raise SetupError(f"(a) drained {done:,} of {args.rows:,} rows")
    seconds = max(r["finished"] for r in reports) - started
    cpu = sum(r["cpu"] for r in reports)
    return Result(args.rows, seconds, cpu, pg_cpu, connections=args.processes)


def pgqueuer(bench: Bench) -> Result:
    """(b): PgQueuer's own table drained by its QueueManagers."""
    try:
        import asyncpg
        from pgqueuer import AsyncpgDriver, Queries
    except ImportError as exc:
        raise SetupError(f"(b) needs PgQueuer: pip install -e '.[bench]' ({exc})") from exc
    rows, processes = bench.args.rows, bench.args.processes
    name, url = bench.scratch("field_b")

    async def install_and_enqueue() -> None:
        conn = await asyncpg.connect(url)
        try:
            queries = Queries(AsyncpgDriver(conn))
            await queries.install()
            for first in range(0, rows, PGQUEUER_ENQUEUE_CHUNK):
                n = min(PGQUEUER_ENQUEUE_CHUNK, rows - first)
                await queries.enqueue([PGQUEUER_ENTRYPOINT] * n, [None] * n, [0] * n)
            await conn.execute("VACUUM ANALYZE pgqueuer")
        finally:
            await conn.close()

    asyncio.run(install_and_enqueue())
    started, reports, pg_cpu = children.run_children(
        _pgqueuer_worker, url, name, processes, bench.args.batch
    )
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*), extract(epoch FROM max(created))::float8 FROM pgqueuer_log"
            " WHERE status = 'successful'"
        ).fetchone()
        left = conn.execute("SELECT count(*) FROM pgqueuer").fetchone()
    bench.done_with(name)
    assert row is not None
    assert left is not None
    if int(row[0]) != rows or int(left[0]) != 0:
        raise SetupError(f"(b) logged {row[0]:,} of {rows:,} jobs done; {left[0]:,} left")
    seconds = float(row[1]) - started
    return Result(rows, seconds, sum(r["cpu"] for r in reports), pg_cpu, connections=processes)


def notifier_drain(bench: Bench, concurrency: int) -> Result:
    """(c): due ``null`` rows drained by notifier's worker, its defaults but ``--set``'s."""
    rows = bench.args.rows
    name, url = bench.database("field_c")
    with workers(bench, f"c-{concurrency}", name, url, {}, concurrency) as (services, conn):
        d = drain(conn, name, services, rows, "null", "bench", 60 + rows / 500, bench.redis)
    bench.done_with(name)
    if d.sent != rows:
        raise SetupError(f"(c) sent {d.sent:,} of {rows:,} rows: {d.by_status}")
    return d.result()


# --- the report --------------------------------------------------------------------------------


@dataclass
class Series:
    """The repeats of one measurement."""

    label: str
    results: list[Result] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(r.rate for r in self.results)

    def line(self) -> str:
        rates = ", ".join(f"{r.rate:,.0f}" for r in self.results)
        middle = sorted(self.results, key=lambda r: r.rate)[len(self.results) // 2]
        return (
            f"  {self.label:<52} median {self.median:>9,.0f} rows/s  ({rates});"
            f" CPU per row of the median run: {middle.per_row()}"
        )


def show(label: str, result: Result) -> None:
    print(
        f"    {label}: {result.rows:,} rows in {result.seconds:.2f}s = {result.rate:,.0f} rows/s;"
        f" per row {result.per_row()}; {result.connections} connections; load {load()}",
        flush=True,
    )


def compare(bench: Bench) -> None:
    args = bench.args
    batch, processes, rows = args.batch, args.processes, args.rows
    default_batch = Settings.model_fields["batch_size"].default
    a = Series(f"(a) minimal table, {processes} procs, batch {batch}")
    b = Series(f"(b) PgQueuer 1.6, {processes} procs, batch {batch}")
    c = Series(f"(c) notifier, --concurrency={processes}, {describe_settings(args.set)}")
    for round_ in range(1, args.repeat + 1):
        print(f"\nround {round_} of {args.repeat} (load {load()})", flush=True)
        a.results.append(minimal(bench))
        show("(a) minimal table", a.results[-1])
        b.results.append(pgqueuer(bench))
        show("(b) PgQueuer", b.results[-1])
        c.results.append(notifier_drain(bench, processes))
        show("(c) notifier", c.results[-1])
    print(f"\n{rows:,} due rows each; median of {args.repeat} runs")
    for series in (a, b, c):
        print(series.line())
    batch_size = args.set.get("batch_size", f"{default_batch}, its default")
    print(
        f"  notifier ran with NOTIFIER_BATCH_SIZE={batch_size};"
        f" settings: {describe_settings(args.set)}"
    )
    print()
    for target, name, share in ((a, "(a)", TARGET_CEILING), (b, "(b)", TARGET_PGQUEUER)):
        line = ratio_line(name, c.results, target.results, share)
        if args.set:
            line += " (the targets are for notifier's defaults)"
        print(f"  {line}")


def scaling(bench: Bench) -> None:
    args = bench.args
    levels: list[int] = args.scaling
    series = {
        n: Series(f"notifier, --concurrency={n}, {describe_settings(args.set)}") for n in levels
    }
    for round_ in range(1, args.repeat + 1):
        print(f"\nround {round_} of {args.repeat} (load {load()})", flush=True)
        for n in levels:
            series[n].results.append(notifier_drain(bench, n))
            show(f"--concurrency={n}", series[n].results[-1])
    print(f"\n{args.rows:,} due null rows each; median of {args.repeat} runs")
    for n in levels:
        most = max(r.connections for r in series[n].results)
        print(series[n].line() + f"; at most {most} connections")


def main(argv: Sequence[str] | None = None) -> int:
    parser = harness.parser(__doc__, ["rows", "set", "keep", "round_trip"])
    parser.add_argument("--batch", type=harness.positive, default=500, help="batch of (a), (b)")
    parser.add_argument(
        "--processes", type=harness.positive, default=2, help="processes of (a), (b), (c)"
    )
    parser.add_argument(
        "--repeat", type=harness.positive, default=3, help="runs of each; the median counts"
    )
    parser.add_argument(
        "--scaling", type=harness.levels, default=None, help="only notifier, these worker counts"
    )
    args = harness.parse(parser, argv)
    measure = scaling if args.scaling else compare
    return harness.with_round_trips(args, argv, lambda: run_interruptibly(
        lambda a: harness.run("against the field", REDIS, a, [measure]), args
    ))  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
