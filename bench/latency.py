"""Insert-to-sent latency of notifier at light load, with real worker and beat processes.

What it measures
    A producer INSERTs rows one per transaction, about 20 a second, and the benchmark reads back
    how long each took to be sent, by the database's own clock:

    * ``null, light load`` and ``webhook, light load``: ``sent_at - created_at`` of ``--rows``
      rows (default 200) on the ``null`` channel, then on the ``webhook`` channel to a local
      receiver that answers 200 at once. ``created_at`` is the start of the producer's
      transaction, which commits right after the INSERT; ``sent_at`` is the start of the
      transaction that records the send, so the figure covers NOTIFY, the wake-up, the Celery
      round trip through Redis, the claim, the send and the write-back.
    * ``delayed: lateness``: ``sent_at - next_attempt_at`` of ``--delayed`` rows (default 50,
      ``null`` channel) inserted with ``next_attempt_at = now() + 2..6 s``, i.e. how late a
      delayed row goes out after its time.

    It prints p50/p95/p99/max in milliseconds (nearest-rank percentiles) and checks the
    targets below. Beat keeps its production interval (``NOTIFIER_DISPATCH_INTERVAL``, 30 s):
    these latencies come from the wake-ups on insert (``notifier/worker/wakeup.py``), and a row
    that a missed wake-up leaves to beat shows up as an outlier of up to 30 s.

Targets
    * light load (null and webhook): p95 < 1000 ms;
    * delayed rows: every one sent within 1 s of its ``next_attempt_at``.

    The exit status is 0 whether the targets are met or not (it is a benchmark, not a test);
    it is 1 if the set-up fails (no PostgreSQL or Redis, a worker that never gets ready, ...)
    or PostgreSQL or Redis goes away during the run, and 130 when interrupted (Ctrl-C,
    SIGTERM).

How to run it
    From the repository root, with PostgreSQL and Redis on localhost::

        python bench/latency.py [--rows N] [--delayed M] [--keep]

    It takes about a minute. It creates the database ``notifier_bench_latency_<pid>``
    (``NOTIFIER_BENCH_POSTGRES``, default ``postgresql://postgres@127.0.0.1:5432``), flushes
    a Redis server of its own (or the database ``NOTIFIER_BENCH_REDIS`` names), and runs,
    from the repository root, exactly what production runs::

        python -m celery -A notifier worker --concurrency=2 --loglevel=WARNING
        python -m celery -A notifier beat --loglevel=WARNING --schedule=<temp dir>/...

    with ``NOTIFIER_*`` variables from the calling shell left out, so that only the settings
    below apply: the two URLs, ``NOTIFIER_WEBHOOK_ALLOW_HTTP=true``,
    ``NOTIFIER_WEBHOOK_ALLOWED_NETWORKS=127.0.0.0/8,::1/128`` (the receiver is on loopback) and
    a heartbeat file in the temp dir. Once ``celery inspect ping`` answers and the worker's
    wake-up listener is connected, warm-up rows (null and webhook, not measured; at least 2 s,
    until each pool process has sent both channels) pay the pool processes' first-use costs:
    connections, the providers, the HTTP client. At the end the processes get SIGTERM (SIGKILL
    after 20 s), and the database, its Redis and the temp dir (logs, beat schedule) are
    removed, unless ``--keep``.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

# The repository first, and this folder off the path: its email.py would shadow the standard
# library's email package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench import harness
from bench.common import Conn, SetupError, run_interruptibly
from bench.drains import status_counts, workers
from bench.harness import Bench
from tests.receiver import Receiver

REDIS = os.environ.get("NOTIFIER_BENCH_REDIS")

#: Seconds between two inserts of the light-load scenarios: about 20 rows a second.
SPACING = 0.05
#: Seconds between two inserts of delayed rows, and the range of their delays.
DELAYED_SPACING = 0.1
DELAY_RANGE = (2.0, 6.0)
#: How long to wait for the rows of a scenario after its last insert: beat's 30 s interval and
#: a margin, so a row a wake-up missed is still sent (by beat) and counted as an outlier.
SETTLE_TIMEOUT = 35.0
#: Worker pool processes (``--concurrency``).
CONCURRENCY = 2
#: Warm-up: at least this many seconds of rows, alternately webhook and null, at most the limit.
WARMUP_SECONDS = 2.0
WARMUP_LIMIT = 15.0
WARMUP_SPACING = 0.05
#: During the warm-up the receiver answers this slowly, so that a pool process busy with a
#: webhook leaves the next dispatch to an idle one and every pool process gets rows.
WARMUP_RECEIVER_DELAY = 0.2
#: Targets.
P95_TARGET_MS = 1000.0
LATENESS_TARGET_MS = 1000.0
SEED = 20261129
# --- statistics --------------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an ascending, non-empty sequence."""
    rank = max(math.ceil(p / 100 * len(sorted_values)), 1)
    return sorted_values[rank - 1]


@dataclass
class Result:
    """One scenario's measurements, in milliseconds, in insertion order."""

    name: str
    inserted: int
    values_ms: list[float]
    #: rows that did not end ``sent`` within the time allowed, by status
    unsent: dict[str, int] = field(default_factory=dict)
    insert_seconds: float = 0.0

    def stat(self, p: float) -> float:
        return percentile(sorted(self.values_ms), p) if self.values_ms else math.nan

    @property
    def max(self) -> float:
        return max(self.values_ms) if self.values_ms else math.nan

    def slowest(self, count: int = 3) -> list[tuple[int, float]]:
        """(1-based position in insertion order, ms) of the slowest rows."""
        ranked = sorted(enumerate(self.values_ms, 1), key=lambda pair: -pair[1])
        return ranked[:count]


# --- producing and reading back ----------------------------------------------------------------


def insert_null(conn: Conn, i: int, delay: float = 0.0) -> int:
    """One row on the ``null`` channel, in a transaction of its own (autocommit)."""
    row = conn.execute(
        "INSERT INTO notifications (channel, recipient, subject, body, next_attempt_at)"
        " VALUES ('null', 'bench', 'latency', %s, now() + make_interval(secs => %s))"
        " RETURNING id",
        (f"row {i}", delay),
    ).fetchone()
    assert row is not None
    return int(row[0])


def insert_webhook(conn: Conn, i: int, url: str) -> int:
    row = conn.execute(
        "INSERT INTO notifications (channel, recipient, subject, payload)"
        " VALUES ('webhook', %s, 'bench.latency', %s::jsonb) RETURNING id",
        (url, json.dumps({"row": i})),
    ).fetchone()
    assert row is not None
    return int(row[0])


def paced(count: int, spacing: float, insert: Callable[[int], int]) -> tuple[list[int], float]:
    """Call ``insert(i)`` ``count`` times, one every ``spacing`` s on a fixed schedule."""
    ids = []
    start = time.monotonic()
    for i in range(count):
        pause = start + i * spacing - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        ids.append(insert(i))
    return ids, time.monotonic() - start


def wait_settled(conn: Conn, ids: list[int], timeout: float) -> dict[str, int]:
    """Wait until no row of ``ids`` is pending or processing; return the count by status."""
    deadline = time.monotonic() + timeout
    while True:
        counts = status_counts(conn, ids)
        unfinished = counts.get("pending", 0) + counts.get("processing", 0)
        if not unfinished or time.monotonic() >= deadline:
            return counts
        time.sleep(0.2)


Since = Literal["created_at", "next_attempt_at"]


def latencies(conn: Conn, ids: list[int], since: Since) -> list[float]:
    """``sent_at - <since>`` in ms of the sent rows of ``ids``, in insertion order."""
    rows = conn.execute(
        f"SELECT extract(epoch FROM sent_at - {since}) * 1000 FROM notifications"
        " WHERE id = ANY(%s) AND status = 'sent' ORDER BY id",
        (ids,),
    ).fetchall()
    return [float(r[0]) for r in rows]


def scenario(
    conn: Conn, name: str, count: int, spacing: float, insert: Callable[[int], int], since: Since
) -> Result:
    print(f"  {name}: inserting {count} rows, one every {spacing * 1000:.0f} ms ...", flush=True)
    ids, seconds = paced(count, spacing, insert)
    counts = wait_settled(conn, ids, SETTLE_TIMEOUT)
    unsent = {s: n for s, n in counts.items() if s != "sent"}
    return Result(name, count, latencies(conn, ids, since), unsent, seconds)


def warm_up(conn: Conn, receiver: Receiver) -> int:
    """Send unmeasured rows until every pool process has sent a null and a webhook row.

    A pool process pays for its first rows of a channel (connections, the provider, the HTTP
    client). At light load one process gets nearly every dispatch, so a plain warm-up would
    leave the other cold, and its first send in the measurement an outlier of hundreds of ms.
    Returns how many pool processes have sent both channels (``claimed_by`` names them).
    """
    started = time.monotonic()
    ids: list[int] = []
    receiver.delay = WARMUP_RECEIVER_DELAY
    try:
        while True:
            burst, _ = paced(
                round(WARMUP_SECONDS / WARMUP_SPACING),
                WARMUP_SPACING,
                lambda i: insert_null(conn, i) if i % 2 else insert_webhook(conn, i, receiver.url),
            )
            ids += burst
            counts = wait_settled(conn, ids, SETTLE_TIMEOUT)
            if counts.get("sent", 0) != len(ids):
                raise SetupError(f"warm-up rows were not all sent: {counts}")
            row = conn.execute(
                "SELECT count(*) FROM (SELECT claimed_by FROM notifications WHERE id = ANY(%s)"
                " GROUP BY claimed_by HAVING count(DISTINCT channel) = 2) AS warm",
                (ids,),
            ).fetchone()
            warmed = int(row[0]) if row else 0
            if warmed >= CONCURRENCY or time.monotonic() - started >= WARMUP_LIMIT:
                return warmed
    finally:
        receiver.delay = 0.0


# --- set-up and report -------------------------------------------------------------------------


def _fmt(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1f}"


def report(results: list[Result], late: Result) -> None:
    print()
    print(f"{'scenario':<22}{'rows':>6}{'p50 ms':>10}{'p95 ms':>10}{'p99 ms':>10}{'max ms':>10}")
    for r in [*results, late]:
        rows = str(len(r.values_ms)) if not r.unsent else f"{len(r.values_ms)}/{r.inserted}"
        print(
            f"{r.name:<22}{rows:>6}{_fmt(r.stat(50)):>10}{_fmt(r.stat(95)):>10}"
            f"{_fmt(r.stat(99)):>10}{_fmt(r.max):>10}"
        )
    print()
    for r in [*results, late]:
        rate = r.inserted / r.insert_seconds if r.insert_seconds else math.nan
        slowest = ", ".join(f"#{pos} {ms:.0f} ms" for pos, ms in r.slowest())
        extra = f"; NOT SENT: {r.unsent}" if r.unsent else ""
        print(f"  {r.name}: {rate:.1f} rows/s inserted; slowest (by position): {slowest}{extra}")

    print("\ntargets")
    for r in results:
        ok = not r.unsent and r.stat(95) < P95_TARGET_MS
        print(
            f"  {'PASS' if ok else 'FAIL'}  {r.name}: p95 < {P95_TARGET_MS:.0f} ms"
            f" (p95 {_fmt(r.stat(95))} ms{', some rows not sent' if r.unsent else ''})"
        )
    too_late = sum(1 for v in late.values_ms if v > LATENESS_TARGET_MS)
    early = sum(1 for v in late.values_ms if v < 0)
    ok = not late.unsent and too_late == 0 and early == 0
    print(
        f"  {'PASS' if ok else 'FAIL'}  delayed: every row sent within"
        f" {LATENESS_TARGET_MS / 1000:.0f} s of its time ({too_late} of {late.inserted} more than"
        f" {LATENESS_TARGET_MS / 1000:.0f} s late, {early} early"
        f"{f', {sum(late.unsent.values())} not sent' if late.unsent else ''})"
    )
    print("(other work on the machine adds to latency)")


def measure(bench: Bench) -> None:
    name, url = bench.database("latency")
    receiver = Receiver().start()
    settings = {
        "webhook_allow_http": "true",
        "webhook_allowed_networks": "127.0.0.0/8,::1/128",  # the receiver
    }
    try:
        with workers(bench, "latency", name, url, settings, CONCURRENCY) as (services, db):
            warmed = warm_up(db, receiver)
            print(f"  warm-up: {warmed} of {CONCURRENCY} pool processes have sent both channels")
            rng = random.Random(SEED)
            hook = receiver.url
            results = [
                scenario(
                    db,
                    "null, light load",
                    bench.args.rows,
                    SPACING,
                    lambda i: insert_null(db, i),
                    "created_at",
                ),
                scenario(
                    db,
                    "webhook, light load",
                    bench.args.rows,
                    SPACING,
                    lambda i: insert_webhook(db, i, hook),
                    "created_at",
                ),
            ]
            late = scenario(
                db,
                "delayed: lateness",
                bench.args.delayed,
                DELAYED_SPACING,
                lambda i: insert_null(db, i, rng.uniform(*DELAY_RANGE)),
                "next_attempt_at",
            )
            bench.notes += [f"ran {command}" for command in services.commands]
    finally:
        receiver.stop()
    bench.done_with(name)
    repeats = sum(n - 1 for n in receiver.counts().values() if n > 1)
    if repeats:
        bench.notes.append(f"the receiver got {repeats} repeated webhook deliveries")
    report(results, late)


def main(argv: Sequence[str] | None = None) -> int:
    parser = harness.parser(__doc__, ["rows", "keep"])
    parser.set_defaults(rows=200)
    parser.add_argument("--delayed", type=harness.positive, default=50, help="delayed rows")
    args = harness.parse(parser, argv)
    return run_interruptibly(lambda a: harness.run("latency", REDIS, a, [measure]), args)


if __name__ == "__main__":
    sys.exit(main())
