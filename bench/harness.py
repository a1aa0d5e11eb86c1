"""How every benchmark in ``bench/`` runs: its options, its scratch databases, child processes
let go together, the table of results and the clean-up.

Nothing here measures anything. A benchmark is a list of functions taking a ``Bench``; ``main``
parses the options they name (one definition each, in ``OPTIONS``), then ``run`` prints the
machine, calls them in order and prints what they left in ``Bench.lines`` and ``Bench.notes``.
Whatever happens, the databases they made are dropped (unless ``--keep``), the benchmark's Redis
db is flushed and its temp dir removed (kept when something failed, to read the logs).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import re
import shlex
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import redis

from bench import testhost
from bench.common import (
    POSTGRES,
    SetupError,
    admin_connect,
    drop_databases,
    flush_redis,
    git_commit,
    load,
    recreate_database,
    run_interruptibly,
    scratch_database,
    server_settings,
)
from tests.redis_server import RedisServer  # the tests' own Redis of a run, on a free port

#: Worker pool processes unless ``--concurrency`` says otherwise: one per core on the 2-core
#: machine these benchmarks were written for.
CONCURRENCY = 2
#: The batch of the throughput measurements (``NOTIFIER_BATCH_SIZE``, the raw loops' claims).
BATCH = 500
#: The Redis of the measurements: a server of the run's own unless ``NOTIFIER_BENCH_REDIS``
#: names one (whose database is flushed before each measurement and at the end), so that two
#: runs on one machine never flush each other's broker.
REDIS = os.environ.get("NOTIFIER_BENCH_REDIS")
POLL = 0.2

Measure = Callable[["Bench"], None]


# --- options -----------------------------------------------------------------------------------


def positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: must be at least 1")
    return number


def levels(value: str) -> list[int]:
    """A comma-separated list of positive integers, e.g. ``1,2,4``."""
    try:
        numbers = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: expected e.g. 1,2,4") from None
    if not numbers or min(numbers) < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: expected positive integers, e.g. 1,2,4")
    return numbers


def milliseconds(value: str) -> list[float]:
    """A comma-separated list of positive numbers of milliseconds, e.g. ``0.6,2``."""
    try:
        numbers = [float(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: expected e.g. 0.6,2") from None
    if not numbers or min(numbers) <= 0:
        raise argparse.ArgumentTypeError(f"{value!r}: expected positive milliseconds, e.g. 2")
    return numbers


def setting(value: str) -> tuple[str, str]:
    """``--set NAME=VALUE``: ``("name", "value")`` for ``NOTIFIER_NAME=VALUE``."""
    name, sep, setting_ = value.partition("=")
    name = name.strip().upper().removeprefix("NOTIFIER_")
    if not sep or not re.fullmatch(r"[A-Z0-9_]+", name):
        raise argparse.ArgumentTypeError(f"{value!r}: expected NAME=VALUE, e.g. BATCH_SIZE=500")
    return name.lower(), setting_


def describe_settings(settings: dict[str, str]) -> str:
    """``defaults``, or the ``NOTIFIER_*`` settings given."""
    return " ".join(f"NOTIFIER_{k.upper()}={v}" for k, v in settings.items()) or "defaults"


#: Every option a benchmark may take, defined once: (flags, ``add_argument``'s keywords).
OPTIONS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "rows": (("--rows",), {"type": positive, "default": 100_000, "help": "due rows per drain"}),
    "million": (("--million",), {"action": "store_true", "help": "--rows 1000000"}),
    "rows_campaign": (
        ("--rows-campaign",),
        {"type": positive, "default": 1_000_000, "help": "recipients of the campaign"},
    ),
    "rows_webhook": (
        ("--rows-webhook",),
        {"type": positive, "default": 20_000, "help": "webhook rows"},
    ),
    "count": (
        ("--count",),
        {"type": positive, "default": 20_000, "help": "emails per target (default 20,000)"},
    ),
    "api_limit": (
        ("--api-limit",),
        {
            "type": positive,
            "default": 2_000,
            "help": "messages a second the email APIs' servers take in the limited runs"
            " (default 2,000)",
        },
    ),
    "ses_limit": (
        ("--ses-limit",),
        {
            "type": positive,
            "default": 500,
            "help": "messages a second the SES server takes in its limited run, below what one"
            " message a request can reach (default 500)",
        },
    ),
    "send_concurrency": (
        ("--send-concurrency",),
        {
            "type": levels,
            "default": [100, 200, 400],
            "help": "NOTIFIER_ASYNC_SEND_CONCURRENCY for the webhooks; each of a comma-separated"
            " list is tried (default 100,200,400)",
        },
    ),
    "rate_batch_size": (
        ("--rate-batch-size",),
        {
            "type": positive,
            "default": None,
            "help": "NOTIFIER_BATCH_SIZE under the rate limit (default: unset, notifier's own)",
        },
    ),
    "concurrency": (
        ("--concurrency",),
        {
            "type": positive,
            "default": CONCURRENCY,
            "help": f"worker pool processes (default {CONCURRENCY})",
        },
    ),
    "set": (
        ("--set",),
        {
            "type": setting,
            "action": "append",
            "default": [],
            "metavar": "NAME=VALUE",
            "help": "one more NOTIFIER_<NAME> setting for every worker (repeatable), e.g."
            " --set BATCH_SIZE=500 or --set RECORD_ATTEMPTS=false",
        },
    ),
    "round_trip": (
        ("--round-trip",),
        {
            "type": milliseconds,
            "default": [],
            "metavar": "MS[,MS...]",
            "help": "after the run on loopback, run again against a PostgreSQL on a test host"
            " this many milliseconds away, for each one given (needs root and the netdelay"
            " tools: bench/testhost.py)",
        },
    ),
    "keep": (
        ("--keep",),
        {
            "action": "store_true",
            "help": "keep the databases and logs afterwards (and the Redis database that"
            " NOTIFIER_BENCH_REDIS names; a Redis of the run's own stops with it)",
        },
    ),
}


def parser(doc: str | None, names: Sequence[str]) -> argparse.ArgumentParser:
    """A parser with the ``OPTIONS`` named; its help shows ``doc``, the script's docstring."""
    made = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for name in names:
        flags, keywords = OPTIONS[name]
        made.add_argument(*flags, **keywords)
    return made


def parse(made: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    args = made.parse_args(argv)
    args.set = dict(getattr(args, "set", []))
    if getattr(args, "million", False):
        args.rows = 1_000_000
    return args


def main(
    doc: str | None,
    title: str,
    redis_url: str | None,
    options: Sequence[str],
    measures: Sequence[Measure],
    argv: Sequence[str] | None = None,
) -> int:
    """A benchmark script's ``main``: parse ``options``, run ``measures``."""
    args = parse(parser(doc, [*options, "round_trip"]), argv)
    return with_round_trips(args, argv, lambda: run_interruptibly(
        lambda a: run(title, redis_url, a, measures), args
    ))  # fmt: skip


def with_round_trips(
    args: argparse.Namespace, argv: Sequence[str] | None, run_here: Callable[[], int]
) -> int:
    """``run_here()``, and with ``--round-trip``, the script again against test hosts that far
    away (``bench.testhost``)."""
    if not args.round_trip:
        return run_here()
    given = list(sys.argv[1:] if argv is None else argv)
    script = str(Path(sys.argv[0]).resolve())
    again = [script, *testhost.without_round_trip(given)]
    return testhost.with_round_trips(args.round_trip, again, run_here)


# --- one run -----------------------------------------------------------------------------------


@dataclass
class Line:
    """One line of the final table."""

    measurement: str
    value: str
    target: str = "-"
    result: str = ""


@dataclass
class Result:
    """Rows done in how many seconds, and the CPU they cost."""

    rows: int
    seconds: float
    client_cpu: float = 0.0
    postgres_cpu: float = 0.0
    redis_cpu: float = 0.0
    connections: int = 0

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("nan")

    def per_row(self) -> str:
        us = 1e6 / max(self.rows, 1)
        text = f"{self.client_cpu * us:.0f} us client + {self.postgres_cpu * us:.0f} us PostgreSQL"
        return text + (f" + {self.redis_cpu * us:.0f} us Redis" if self.redis_cpu else "")


@dataclass
class Bench:
    """What the measurements of one run share: options, temp dir, databases, the report."""

    args: argparse.Namespace
    redis: str
    workdir: Path
    databases: list[str] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)
    settings_used: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: figures one measurement leaves for a later one (the ceiling, for notifier's share of it)
    found: dict[str, Result] = field(default_factory=dict)

    def database_name(self, tag: str) -> str:
        """``notifier_bench_<tag>_<pid>``: no other run on the server uses it."""
        name = f"notifier_bench_{tag}_{os.getpid()}"
        if name not in self.databases:
            self.databases.append(name)
        return name

    def database(self, tag: str) -> tuple[str, str]:
        """A freshly migrated notifier database: its name and URL."""
        name = self.database_name(tag)
        return name, recreate_database(name)

    def scratch(self, tag: str) -> tuple[str, str]:
        """An empty database: its name and URL."""
        name = self.database_name(tag)
        return name, scratch_database(name)

    def done_with(self, name: str) -> None:
        if not self.args.keep:
            drop_databases([name])

    def report(self, command: str) -> None:
        if self.args.set:
            extra = describe_settings(self.args.set)
            self.settings_used.append(f"every worker also got (--set): {extra}")
        if self.lines:
            print()
            heads = ("measurement", "value", "target", "result")
            cells = [heads, *((x.measurement, x.value, x.target, x.result) for x in self.lines)]
            widths = [max(len(row[i]) for row in cells) + 2 for i in range(3)]
            for row in cells:
                text = "".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + row[3]
                print(text.rstrip())
        print()
        for used in self.settings_used:
            print(f"settings {used}")
        for note in self.notes:
            print(f"note {note}")
        print(f"load average at the end: {load()}")
        print(f"command: {command}")


def fmt_int(value: float) -> str:
    """``12,345``, or ``-`` for a figure that could not be measured."""
    return f"{value:,.0f}" if math.isfinite(value) else "-"


def ratio_line(name: str, ours: Sequence[Result], theirs: Sequence[Result], target: float) -> str:
    """``notifier / <name> = <ratio of the medians> (target >= ...): PASS``, round by round."""
    ratio = _median(ours) / _median(theirs)
    rounds = " ".join(f"{x.rate / y.rate:.2f}" for x, y in zip(ours, theirs, strict=True))
    verdict = "PASS" if ratio >= target else "FAIL"
    return f"notifier / {name} = {ratio:.2f} (target >= {target}): {verdict}; rounds {rounds}"


def _median(results: Sequence[Result]) -> float:
    return statistics.median(r.rate for r in results)


def run(
    title: str, redis_url: str | None, args: argparse.Namespace, measures: Sequence[Measure]
) -> int:
    """Run ``measures`` against ``redis_url``, or a Redis server of this run's own."""
    if redis_url is not None:
        return _run(title, redis_url, args, measures)
    try:
        server = RedisServer().start()
    except RuntimeError as exc:
        print(f"setup failed: {exc}", file=sys.stderr)
        return 1
    try:
        return _run(title, server.url, args, measures)
    finally:
        server.close()


def _run(title: str, redis_url: str, args: argparse.Namespace, measures: Sequence[Measure]) -> int:
    command = shlex.join([sys.executable, *sys.argv])
    workdir = Path(tempfile.mkdtemp(prefix="notifier-bench-"))
    bench = Bench(args, redis_url, workdir)
    failed = False
    try:
        with admin_connect() as admin:
            pg = server_settings(
                admin, ["server_version", "shared_buffers", "synchronous_commit", "autovacuum"]
            )
        print(
            f"notifier {title} ({git_commit()}, Python {platform.python_version()},"
            f" {os.cpu_count()} CPUs, load average {load()})"
        )
        print(
            f"  PostgreSQL {pg['server_version']} on {POSTGRES} (shared_buffers"
            f" {pg['shared_buffers']}, synchronous_commit {pg['synchronous_commit']},"
            f" autovacuum {pg['autovacuum']}); Redis {redis_url}; logs {workdir}"
        )
        flush_redis(redis_url)
        for measure in measures:
            measure(bench)
        bench.report(command)
        return 0
    except SetupError as exc:
        failed = True
        print(f"\nsetup failed: {exc}", file=sys.stderr)
        bench.report(command)
        return 1
    except (psycopg.OperationalError, redis.RedisError) as exc:
        failed = True
        print(f"\nrun failed (was PostgreSQL or Redis restarted?): {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        raise
    except BaseException:
        failed = True  # keep the logs to look at
        raise
    finally:
        if not args.keep:
            try:
                drop_databases(bench.databases)
            except psycopg.Error as exc:
                print(f"could not drop {', '.join(bench.databases)}: {exc}", file=sys.stderr)
            with contextlib.suppress(SetupError):
                flush_redis(redis_url)
        if args.keep or failed:
            print(f"kept logs in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
