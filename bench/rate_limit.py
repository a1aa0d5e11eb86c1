"""The rate limiter's grants: sends per second under a limit, from the database and from Redis.

What it measures
    ``NOTIFIER_RATE_LIMITS=null=500/s``, a worker with ``--concurrency=2`` (two pool processes
    sharing the limit), notifier's default batch size unless ``--rate-batch-size``. 15,000 due
    ``null`` rows are inserted (30 s worth) and the bench looks after 22 s. From the database:
    rows per second by ``date_trunc('second', sent_at)`` over the 20 full seconds after the
    first send, their mean, the largest count in a calendar second and in any sliding 1 s
    window (``sent_at`` is when each send ended, on the worker's clock). The bench also reads
    the limiter itself: Redis ``MONITOR`` (``bench/servers.py``) shows every ``HSET`` the
    limiter's Lua script makes (tokens left, server time), from which each grant, i.e. each
    send (``null`` sends inline right after its grant), is reconstructed exactly. Both are
    shown.

Targets
    The mean within 5 % of 500/s and no 1 s window above 500 + one burst (50, the default burst
    of 500/s). The exit status is 0 whether the targets are met or not; 1 if the set-up fails
    or PostgreSQL or Redis goes away; 130 when interrupted.

How to run it
    From the repository root, with PostgreSQL and Redis on localhost; it takes about 40 s::

        python bench/rate_limit.py [--rate-batch-size N] [--set NAME=VALUE] [--keep]

    Its database ``notifier_bench_rate_limit_<pid>``; a Redis server of its own (or the database
    ``NOTIFIER_BENCH_REDIS`` names, flushed before and after).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

# The repository first, and this folder off the path: its email.py would shadow the standard
# library's email package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench import harness
from bench.common import SetupError
from bench.drains import insert_due, workers
from bench.harness import CONCURRENCY, Bench, Line
from bench.servers import GrantRecorder

#: The limit, the rows inserted, how long the bench watches and the window it judges.
RATE = 500
RATE_SPEC = f"null={RATE}/s"
#: notifier.delivery.ratelimit's default burst for a per-second window.
RATE_BURST = math.ceil(RATE / 10)
RATE_ROWS = 15_000
RATE_WATCH_SECONDS = 22.0
RATE_WINDOW_SECONDS = 20
RATE_KEY = f"notifier:rate:null:{RATE}/s"
RATE_TOLERANCE = 0.05
OPTIONS = ("rate_batch_size", "set", "keep")


def window_stats(
    events: Sequence[tuple[float, int]], first_second: int, seconds: int
) -> tuple[list[int], int]:
    """Counts per calendar second ``first_second .. + seconds - 1`` and the largest count in
    any sliding 1 s window ``[t, t + 1)`` of events inside those seconds. ``events``: (Unix s,
    count), ascending."""
    end = first_second + seconds
    inside = [(t, n) for t, n in events if first_second <= t < end]
    per_second = [0] * seconds
    for t, n in inside:
        per_second[math.floor(t) - first_second] += n
    best = total = j = 0
    for t, n in inside:  # windows starting at each event
        while j < len(inside) and inside[j][0] < t + 1.0:
            total += inside[j][1]
            j += 1
        best = max(best, total)
        total -= n
    return per_second, best


def measure(bench: Bench) -> None:
    batch = bench.args.rate_batch_size  # None: notifier's default
    print(
        f"\n5. rate limit {RATE_SPEC}: {RATE_ROWS:,} rows, {CONCURRENCY} pool processes,"
        f" watched for {RATE_WATCH_SECONDS:.0f}s"
    )
    name, url = bench.database("rate_limit")
    settings = {"rate_limits": RATE_SPEC}
    if batch is not None:
        settings["batch_size"] = str(batch)
    bench.settings_used.append(
        f"(5) NOTIFIER_RATE_LIMITS={RATE_SPEC}, NOTIFIER_BATCH_SIZE="
        + (str(batch) if batch is not None else "unset (notifier's default, 100)")
    )
    recorder = GrantRecorder(bench.redis, RATE_KEY)
    with workers(bench, "rate", name, url, settings) as (_, conn):
        recorder.start_and_wait()
        try:
            _, committed = insert_due(conn, RATE_ROWS, "null", "bench")
            time.sleep(max(committed + RATE_WATCH_SECONDS - time.time(), 0.0))
            sent = [
                float(r[0])
                for r in conn.execute(
                    "SELECT extract(epoch FROM sent_at)::float8 FROM notifications"
                    " WHERE status = 'sent' ORDER BY sent_at"
                ).fetchall()
            ]
        finally:
            recorder.stop()
    bench.done_with(name)
    if recorder.error:
        bench.notes.append(f"(5) Redis MONITOR failed: {recorder.error}")
    grants = recorder.grants(RATE / 1000.0, RATE_BURST)
    if not sent:
        raise SetupError("no row was sent under the rate limit")
    limit = RATE + RATE_BURST
    first = math.floor(sent[0]) + 1
    db_seconds, db_sliding = window_stats([(t, 1) for t in sent], first, RATE_WINDOW_SECONDS)
    db_mean = sum(db_seconds) / RATE_WINDOW_SECONDS
    db_dev = db_mean / RATE - 1
    print(f"  database: {len(sent):,} rows sent")
    print(f"  per second by sent_at: {' '.join(map(str, db_seconds))}")
    print(
        f"  mean {db_mean:.1f}/s ({db_dev:+.1%}), max in a calendar second"
        f" {max(db_seconds)}, max in any sliding 1 s window {db_sliding}"
    )
    bench.lines.append(
        Line(
            f"5 rate limit {RATE}/s, 2 processes, {RATE_WINDOW_SECONDS} s",
            f"{db_mean:.0f}/s ({db_dev:+.1%})",
            f"within {RATE_TOLERANCE:.0%}",
            "PASS" if abs(db_dev) <= RATE_TOLERANCE else "FAIL",
        )
    )
    bench.lines.append(
        Line(
            "   max in any 1 s window (sent_at)",
            f"{max(db_sliding, max(db_seconds))}",
            f"<= {limit}",
            "PASS" if db_sliding <= limit else "FAIL",
        )
    )
    if grants:
        g_first = math.floor(grants[0][0]) + 1
        g_seconds, g_sliding = window_stats(grants, g_first, RATE_WINDOW_SECONDS)
        g_mean = sum(g_seconds) / RATE_WINDOW_SECONDS
        g_dev = g_mean / RATE - 1
        print(
            f"  limiter (Redis MONITOR): {sum(n for _, n in grants):,} sends granted in"
            f" {len(grants):,} grants, {len(recorder.writes):,} acquire calls"
        )
        print(f"  per second by grant time: {' '.join(map(str, g_seconds))}")
        print(
            f"  mean {g_mean:.1f}/s ({g_dev:+.1%}), max in a calendar second"
            f" {max(g_seconds)}, max in any sliding 1 s window {g_sliding}"
        )
        bench.lines.append(
            Line(
                "   sends by grant time (limiter), mean",
                f"{g_mean:.0f}/s ({g_dev:+.1%})",
                f"within {RATE_TOLERANCE:.0%}",
                "PASS" if abs(g_dev) <= RATE_TOLERANCE else "FAIL",
            )
        )
        bench.lines.append(
            Line(
                "   max in any 1 s window (grant time)",
                f"{g_sliding}",
                f"<= {limit}",
                "PASS" if g_sliding <= limit else "FAIL",
            )
        )
    else:
        bench.notes.append("(5) no grant was seen in Redis MONITOR")


def main(argv: list[str] | None = None) -> int:
    return harness.main(__doc__, "rate limit", harness.REDIS, OPTIONS, [measure], argv)


if __name__ == "__main__":
    sys.exit(main())
