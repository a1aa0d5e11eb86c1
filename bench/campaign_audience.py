"""A campaign's audience import and launch on this machine, each timed on its own.

What it measures
    **import**: ``Campaigns.import_audience`` of a CSV of ``--lines`` lines (default 1,000,000;
    columns ``email,name``), one line in ``--every`` (default 100) repeating an earlier line's
    recipient, into a fresh campaign of ``--channel`` (default null), each recipient checked
    for it; the file read as bytes, as ``notifier campaign audience --csv`` reads it
    (``--as-text``: as UTF-8 text). Seconds from the call to its return (the file is written
    before the clock starts).
    **launch**: ``Campaigns.launch`` of ``--recipients`` recipients (default 100,000) with codes,
    once with ``{placeholder}`` subject and body, once naming a stored template whose subject,
    body and html use ``name`` and ``code`` (``--only import`` skips it). Seconds of the launch
    alone, the audience and codes imported before the clock starts.

Beside the wall-clock seconds, the CPU seconds the benchmark's process and its PostgreSQL
backends used meanwhile (``/proc/<pid>/stat``): on a machine shared with other work, the figure
that moves least with the load.

Each measurement runs ``--runs`` times (default 3) in a database of its own
(``notifier_bench_campaigns_<pid>``, created, migrated and dropped); the median and every run are
printed. No workers run.

How to run it
    From the repository root, with PostgreSQL on localhost::

        python bench/campaign_audience.py [--lines N] [--recipients N] [--runs N]
            [--only import|launch] [--channel CHANNEL] [--as-text]
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# The repository first, and this folder off the path: its email.py would shadow the standard
# library's email package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

from sqlalchemy import Engine, create_engine, event

from bench.common import cpu_seconds, drop_databases, load, recreate_database, sqlalchemy_url
from notifier.campaigns import Campaigns
from notifier.campaigns.audience_file import text_lines
from notifier.db.templates import upsert_template

DATABASE = f"notifier_bench_campaigns_{os.getpid()}"  # two runs at once do not collide
PLACEHOLDERS = ("A gift, {name}", "Hi {name}, use {code} by Friday.")
TEMPLATE = (
    "A gift, {{ name }}",
    "Hi {{ name }}, use {{ code }} by Friday.",
    "<p>Hi {{ name }}, use <b>{{ code }}</b> by Friday.</p>",
)


@dataclass(frozen=True)
class Run:
    #: seconds from the call to its return
    wall: float
    #: CPU seconds of this process and its PostgreSQL backends in that time
    cpu: float


def write_csv(path: Path, lines: int, every: int) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["email", "name"])
        for i in range(lines):
            n = i // 2 if every and i % every == every - 1 else i
            writer.writerow((f"user{n:07d}@example.com", f"User {i}"))


def timed(runs: int, once: Callable[[Campaigns], Callable[[], object]]) -> list[Run]:
    """``runs`` timings of the action ``once`` prepares, each in a fresh database."""
    timings = []
    for _ in range(runs):
        engine = create_engine(sqlalchemy_url(recreate_database(DATABASE)), pool_size=4)
        backends = _backends(engine)
        try:
            action = once(Campaigns(engine))
            before = _cpu(backends)
            started = time.monotonic()
            action()
            wall = time.monotonic() - started
            timings.append(Run(wall, _cpu(backends) - before))
        finally:
            engine.dispose()
            drop_databases([DATABASE])
    return timings


def _backends(engine: Engine) -> list[int]:
    """The process ids of the PostgreSQL backends ``engine`` connects to, as it does."""
    backends: list[int] = []
    event.listen(engine, "connect", lambda conn, _: backends.append(conn.info.backend_pid))
    return backends


def _cpu(backends: list[int]) -> float:
    """CPU seconds used so far by this process and the PostgreSQL backends it connected to."""
    return time.process_time() + sum(cpu_seconds(pid) or 0.0 for pid in backends)


def report(what: str, timings: list[Run]) -> None:
    runs = ", ".join(f"{r.wall:.2f}/{r.cpu:.2f}" for r in timings)
    wall = statistics.median(r.wall for r in timings)
    cpu = statistics.median(r.cpu for r in timings)
    print(
        f"  {what}: median {wall:.2f} s wall, {cpu:.2f} s CPU (runs, wall/CPU: {runs});"
        f" load {load()}",
        flush=True,
    )


def measure_import(args: argparse.Namespace, workdir: Path) -> None:
    path = workdir / "audience.csv"
    write_csv(path, args.lines, args.every)

    def once(campaigns: Campaigns) -> Callable[[], object]:
        campaigns.create("bench", args.channel, body="Hi {name}")

        def run() -> object:
            if args.as_text:
                with path.open(newline="", encoding="utf-8") as rows:
                    return campaigns.import_audience("bench", rows, "email")
            with path.open("rb") as raw:  # as notifier campaign audience --csv reads it
                return campaigns.import_audience("bench", text_lines(raw), "email")

        return run

    read = "as text" if args.as_text else "as bytes"
    what = f"import of {args.lines:,} CSV lines ({args.channel} campaign, read {read})"
    report(what, timed(args.runs, once))


def measure_launch(args: argparse.Namespace, workdir: Path) -> None:
    path = workdir / "launch.csv"
    write_csv(path, args.recipients, 0)

    def prepared(campaigns: Campaigns, template: bool) -> Callable[[], object]:
        if template:
            with campaigns.engine.begin() as conn:
                upsert_template(conn, "gift", "null", "en", TEMPLATE)
            campaigns.create("bench", "null", template="gift")
        else:
            campaigns.create("bench", "null", subject=PLACEHOLDERS[0], body=PLACEHOLDERS[1])
        with path.open(newline="", encoding="utf-8") as rows:
            campaigns.import_audience("bench", rows, "email")
        campaigns.generate_codes("bench", args.recipients)
        return lambda: campaigns.launch("bench")

    for template, how in ((False, "{placeholders}"), (True, "a stored template")):
        report(
            f"launch of {args.recipients:,} with {how}",
            timed(args.runs, lambda c, t=template: prepared(c, t)),  # type: ignore[misc]
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--every", type=int, default=100, help="one line in N repeats one")
    parser.add_argument("--recipients", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", choices=("import", "launch"))
    parser.add_argument(
        "--channel",
        default="null",
        help="the imported campaign's channel, whose recipient check each line gets"
        " (email: the address's shape and domain)",
    )
    parser.add_argument(
        "--as-text",
        action="store_true",
        help="read the file as UTF-8 text, not as bytes decoded by the command's reader",
    )
    args = parser.parse_args()
    print(f"campaign benchmarks; load {load()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="notifier-bench-") as workdir:
        if args.only in (None, "import"):
            measure_import(args, Path(workdir))
        if args.only in (None, "launch"):
            measure_launch(args, Path(workdir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
