"""notifier end to end: due rows drained by a worker and beat, as production runs them.

What it measures
    ``--rows`` due ``null`` rows (default 100,000), inserted in one ``INSERT ... SELECT
    generate_series`` once a worker (``--concurrency=2``) and beat are ready, with
    ``NOTIFIER_BATCH_SIZE=500``, drained by them. Time from the INSERT's commit (the database's
    clock) to the recording of the last sent row (its ``updated_at``); the bench polls every
    0.2 s until no row is pending or processing. Rows per second, the worker processes' peak RSS
    (``VmRSS`` of the main process and its children, sampled every 0.2 s) and the CPU seconds
    used by the worker processes and by their PostgreSQL backends (``/proc/<pid>/stat``).

Targets
    At least 50 % of the raw ceiling (``bench/ceiling.py``), when both run in one invocation:
    ``python bench/throughput.py --only 1,2``; with ``--million``, 1,000,000 rows sent in under
    60 s. The exit status is 0 whether the targets are met or not; 1 if the set-up fails or
    PostgreSQL or Redis goes away; 130 when interrupted.

How to run it
    From the repository root, with PostgreSQL and Redis on localhost::

        python bench/end_to_end.py [--rows N] [--million] [--concurrency N]
                                   [--set NAME=VALUE] [--keep]

    Its database ``notifier_bench_end_to_end_<pid>``; a Redis server of its own (or the database
    ``NOTIFIER_BENCH_REDIS`` names, flushed before and after). ``NOTIFIER_*`` variables of the
    calling shell are left out of the worker's environment; ``--set NAME=VALUE`` adds one (e.g.
    ``--set RECORD_ATTEMPTS=false``).
"""

from __future__ import annotations

import sys
from pathlib import Path

# The repository first, and this folder off the path: its email.py would shadow the standard
# library's email package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench import harness
from bench.drains import drain, workers
from bench.harness import BATCH, Bench, Line, fmt_int

E2E_SHARE = 0.5
MILLION_SECONDS = 60.0
OPTIONS = ("rows", "million", "concurrency", "set", "keep")


def measure(bench: Bench) -> None:
    rows, pool = bench.args.rows, bench.args.concurrency
    print(f"\n2. notifier end to end: {rows:,} null rows, worker --concurrency={pool}")
    name, url = bench.database("end_to_end")
    bench.settings_used.append(
        f"(2) NOTIFIER_BATCH_SIZE={BATCH}, celery worker --concurrency={pool}"
    )
    with workers(bench, "e2e", name, url, {"batch_size": str(BATCH)}, pool) as (services, conn):
        d = drain(conn, name, services, rows, "null", "bench", 60 + rows / 500)
    bench.done_with(name)
    print(
        f"  inserted in {d.insert_seconds:.1f}s; {d.sent:,} of {rows:,} sent in"
        f" {d.seconds:.2f}s (commit to the last row recorded; {d.wall_seconds:.1f}s by polling)"
        f" = {fmt_int(d.rate)} rows/s in {d.batches} recorded batches"
    )
    print(f"  first batch recorded {d.first_batch:.2f}s after the commit; {d.describe()}")
    hwm = ", ".join(f"{k} {v / 1024:.0f} MiB" for k, v in d.peak_hwm_kib.items())
    print(f"  worker RSS: max sum {d.max_rss_kib / 1024:.0f} MiB; peak per process: {hwm}")
    print(
        f"  CPU during the drain: worker processes {d.worker_cpu:.1f}s, PostgreSQL backends"
        f" {d.postgres_cpu:.1f}s; load average {d.load}"
    )
    if d.timed_out or d.sent != rows:
        print(f"  NOT ALL SENT: {d.by_status}{' (timed out)' if d.timed_out else ''}")
    raw = bench.found.get("ceiling")
    if raw is not None:
        share = d.rate / raw.rate
        verdict = "PASS" if share >= E2E_SHARE and not d.timed_out else "FAIL"
        result = f"{verdict} ({share:.0%} of (1))"
        print(f"  per row: notifier {d.result().per_row()}; raw {raw.per_row()}")
    else:
        result = "n/a (run 1 too)"
    bench.lines.append(
        Line(
            f"2 notifier end to end (null, {rows:,} rows)",
            f"{fmt_int(d.rate)} rows/s",
            f">= {E2E_SHARE:.0%} of (1)",
            result,
        )
    )
    bench.lines.append(
        Line(
            f"   worker RSS, max (main + {pool} pool processes)",
            f"{round(d.max_rss_kib / 1024)} MiB",
        )
    )
    if rows >= 1_000_000:
        ok = d.seconds < MILLION_SECONDS and d.sent == rows
        bench.lines.append(
            Line(
                f"   {rows:,} null rows sent, in all",
                f"{d.seconds:.1f} s",
                f"< {MILLION_SECONDS:.0f} s",
                "PASS" if ok else "FAIL",
            )
        )


def main(argv: list[str] | None = None) -> int:
    return harness.main(__doc__, "end-to-end throughput", harness.REDIS, OPTIONS, [measure], argv)


if __name__ == "__main__":
    sys.exit(main())
