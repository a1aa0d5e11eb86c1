"""Where a campaign launch's time goes: the import steps before it, then the launch itself.

What it measures
    A campaign on the ``null`` channel, templates with a field and ``{code}``; a CSV of
    ``--rows-campaign`` recipients (default 1,000,000) written to a temp file first, then timed
    separately: ``Campaigns.import_audience``, ``generate_codes`` (as many codes as recipients)
    and ``launch`` (one notification per recipient written, each with the code at its
    recipient's position), with the launch's statement time by kind (fan-out, ANALYZE, other)
    from SQLAlchemy's cursor events. The target is the launch; the import steps before it are
    shown beside it. No workers run.

Targets
    The launch under 20 s, every recipient enqueued with a distinct code. The exit status is 0
    whether the target is met or not; 1 if the set-up fails; 130 when interrupted.

How to run it
    From the repository root, with PostgreSQL on localhost::

        python bench/campaign_launch.py [--rows-campaign N] [--keep]

    Its database ``notifier_bench_campaign_<pid>`` is dropped afterwards unless ``--keep``.
"""

from __future__ import annotations

import csv
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The repository first, and this folder off the path: its email.py would shadow the standard
# library's email package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

from sqlalchemy import Engine, create_engine, event

from bench import harness
from bench.common import load, sqlalchemy_url
from bench.harness import Bench, Line
from notifier.campaigns import Campaigns

CAMPAIGN_SECONDS = 20.0
OPTIONS = ("rows_campaign", "keep")


class StatementTimes:
    """Time spent in each kind of statement an engine runs (SQLAlchemy cursor events)."""

    KINDS = (
        ("fan-out", "INSERT INTO notifications"),
        ("analyze", "ANALYZE"),
    )

    def __init__(self, engine: Engine) -> None:
        self.seconds: Counter[str] = Counter()
        self.counts: Counter[str] = Counter()
        self.slowest: dict[str, float] = {}
        event.listen(engine, "before_cursor_execute", self._before)
        event.listen(engine, "after_cursor_execute", self._after)

    def _kind(self, statement: str) -> str:
        flat = " ".join(statement.split())
        return next((kind for kind, marker in self.KINDS if marker in flat), "other")

    def _before(self, conn: Any, *_: Any) -> None:
        conn.info["bench_started"] = time.perf_counter()

    def _after(self, conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        took = time.perf_counter() - conn.info.pop("bench_started", time.perf_counter())
        kind = self._kind(statement)
        self.seconds[kind] += took
        self.counts[kind] += 1
        self.slowest[kind] = max(self.slowest.get(kind, 0.0), took)

    def summary(self) -> str:
        return "; ".join(
            f"{kind} {self.seconds[kind]:.1f}s in {self.counts[kind]} statements"
            f" (slowest {self.slowest[kind]:.1f}s)"
            for kind, _ in (*self.KINDS, ("other", ""))
            if self.counts[kind]
        )


def measure(bench: Bench) -> None:
    count = bench.args.rows_campaign
    print(f"\n3. campaign fan-out: {count:,} recipients with codes (no workers)")
    name, url = bench.database("campaign")
    path = bench.workdir / "audience.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["recipient", "name"])
        writer.writerows((f"user{i:07d}@example.com", f"User {i}") for i in range(count))
    print(f"  wrote {path.stat().st_size / 1e6:.0f} MB of CSV", flush=True)
    engine = create_engine(
        sqlalchemy_url(url),
        pool_size=2,
        connect_args={
            "application_name": "bench-campaign",
            "options": "-c statement_timeout=300s",
        },
    )
    try:
        campaigns = Campaigns(engine)
        campaigns.create(
            "bench",
            "null",
            subject="Your code, {name}",
            body="Hi {name}, use {code} before Friday.",
        )
        steps: list[tuple[str, float]] = []

        def timed(step: str, action: Callable[[], int]) -> None:
            started = time.monotonic()
            n = action()
            steps.append((step, time.monotonic() - started))
            print(f"  {step}: {n:,} in {steps[-1][1]:.1f}s", flush=True)

        def audience() -> int:
            with path.open(newline="", encoding="utf-8") as rows:
                return campaigns.import_audience("bench", rows)

        timed("audience import", audience)
        timed("code generation", lambda: campaigns.generate_codes("bench", count))
        statements = StatementTimes(engine)
        timed("launch (codes paired + fan-out)", lambda: campaigns.launch("bench"))
        print(f"    statement time, summed over its connections: {statements.summary()}")
        with engine.connect() as c:
            row = c.exec_driver_sql(
                "SELECT count(*), count(*) FILTER (WHERE payload ? 'code'),"
                " count(DISTINCT payload ->> 'code')"
                " FROM notifications WHERE campaign_id IS NOT NULL"
            ).one()
    finally:
        engine.dispose()
        path.unlink(missing_ok=True)
    bench.done_with(name)
    enqueued, with_code, distinct = (int(v) for v in row)
    total = sum(s for _, s in steps)
    launch = steps[-1][1]
    print(
        f"  {enqueued:,} notifications enqueued, {with_code:,} with a code ({distinct:,}"
        f" distinct); import + codes + launch {total:.1f}s; load average {load()}"
    )
    ok = launch < CAMPAIGN_SECONDS and enqueued == count == with_code == distinct
    bench.lines.append(
        Line(
            f"3 campaign fan-out ({count:,} with codes)",
            f"{launch:.1f} s",
            f"< {CAMPAIGN_SECONDS:.0f} s",
            "PASS" if ok else "FAIL",
        )
    )
    for step, seconds in steps:
        bench.lines.append(Line(f"   {step}", f"{seconds:.1f} s"))
    bench.lines.append(Line("   import + codes + launch", f"{total:.1f} s"))
    bench.notes.append(
        "(3) is the launch: the audience and its code pool are in the database before it,"
        " as they are when an operator launches"
    )


def main(argv: list[str] | None = None) -> int:
    return harness.main(__doc__, "campaign launch", harness.REDIS, OPTIONS, [measure], argv)


if __name__ == "__main__":
    sys.exit(main())
