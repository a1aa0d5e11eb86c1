"""Throughput of notifier on this machine: the five throughput measurements in one run.

What it measures
    Each measurement is a script of its own, runnable alone; this one runs those ``--only``
    names (default all, in this order) in one invocation and prints one table:

    1. ``bench/ceiling.py``: the raw ceiling, notifier's claim and record statements alone.
    2. ``bench/end_to_end.py``: notifier end to end, and its share of (1) when both run.
    3. ``bench/campaign_launch.py``: where a campaign launch's time goes.
    4. ``bench/webhook.py``: webhook sends against a receiver answering after 50 ms.
    5. ``bench/rate_limit.py``: the rate limiter's grants, from the database and Redis MONITOR.

    Each script's docstring says what it measures and its target. The exit status is 0 whether
    the targets are met or not (it is a benchmark, not a test); 1 if the set-up fails or
    PostgreSQL or Redis goes away; 130 when interrupted.

How to run it
    From the repository root, with PostgreSQL and Redis on localhost::

        python bench/throughput.py [--rows N] [--million] [--only 1,2,...] [--keep]

    Development: ``--rows 20000 --rows-campaign 100000``. A full run takes about ten minutes,
    most of it (3) and the tuning of (4). Each measurement gets its own database
    ``notifier_bench_<name>_<pid>`` (migrated with ``notifier.db.migrate.migrate``;
    ``NOTIFIER_BENCH_POSTGRES``, default ``postgresql://postgres@127.0.0.1:5432``), dropped
    right after it unless ``--keep``. A Redis server of its own serves the run (or the database
    ``NOTIFIER_BENCH_REDIS`` names, flushed before each measurement and at the end). Workers run
    exactly as production runs them, from the repository root::

        python -m celery -A notifier worker --concurrency=2 --loglevel=WARNING
        python -m celery -A notifier beat --loglevel=WARNING --schedule=<temp dir>/...

    with ``NOTIFIER_*`` variables from the calling shell left out, so that only the settings
    printed with each measurement apply, plus any ``--set NAME=VALUE`` (e.g. ``--set
    RECORD_ATTEMPTS=false``, for diagnosis). Every process started (Celery processes in
    sessions of their own, the raw loops, the HTTP server) is stopped on exit, Ctrl-C or
    SIGTERM: SIGTERM first, SIGKILL to the process group after 20 s.

    Other load on the machine depresses every figure: the load average is printed at the start
    and with each measurement.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

# The repository first, and this folder off the path: its email.py would shadow the standard
# library's email package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench import campaign_launch, ceiling, end_to_end, harness, rate_limit, webhook
from bench.common import run_interruptibly

MEASUREMENTS = {1: ceiling, 2: end_to_end, 3: campaign_launch, 4: webhook, 5: rate_limit}


def _only(value: str) -> list[int]:
    numbers = sorted(set(harness.levels(value)))
    if any(n not in MEASUREMENTS for n in numbers):
        raise argparse.ArgumentTypeError(f"{value!r}: measurements are numbered 1 to 5")
    return numbers


def main(argv: Sequence[str] | None = None) -> int:
    options = dict.fromkeys(name for m in MEASUREMENTS.values() for name in m.OPTIONS)
    parser = harness.parser(__doc__, list(options))
    parser.add_argument("--only", type=_only, default=list(MEASUREMENTS), help="e.g. 1,2")
    args = harness.parse(parser, argv)
    measures = [MEASUREMENTS[n].measure for n in args.only]
    return run_interruptibly(lambda a: harness.run("throughput", harness.REDIS, a, measures), args)


if __name__ == "__main__":
    sys.exit(main())
