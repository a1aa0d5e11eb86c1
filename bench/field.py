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
       ``bench/throughput.py``'s measurement (2). ``--set NAME=VALUE`` (repeatable) gives the
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

    Databases ``notifier_bench_field_<a|b|c>`` on ``NOTIFIER_BENCH_POSTGRES`` (default
    ``postgresql://postgres@127.0.0.1:5432``); Redis db 12 (``NOTIFIER_BENCH_FIELD_REDIS``),
    flushed before each drain of (c) and at the end. Every process started is stopped on exit,
    Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import platform
import queue
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # notifier and bench.common

import psycopg
import redis

from bench.common import (
    Conn,
    CpuMeter,
    Services,
    SetupError,
    admin_connect,
    backend_pids,
    celery_ping,
    cpu_seconds,
    database_url,
    drop_databases,
    flush_redis,
    git_commit,
    load,
    process_tree,
    recreate_database,
    run_interruptibly,
    server_settings,
    service_env,
    wait_until,
    waker_listening,
)
from notifier.settings import Settings

REDIS = os.environ.get("NOTIFIER_BENCH_FIELD_REDIS", "redis://127.0.0.1:6379/12")
DATABASE_PREFIX = "notifier_bench_field_"
POLL = 0.2
READY_TIMEOUT = 90.0
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


@dataclass
class Result:
    """One drain: rows done in how many seconds, and the CPU it cost."""

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


def run_processes(
    target: Callable[..., None], url: str, database: str, app: str, processes: int, batch: int
) -> tuple[float, list[dict[str, Any]], float]:
    """Start ``processes`` children, let them go together and wait for their reports.

    Returns (Unix time of the start signal, their reports, CPU of their PostgreSQL backends).
    """
    ctx = multiprocessing.get_context("spawn")
    ready: Queue[Any] = ctx.Queue()
    results: Queue[Any] = ctx.Queue()
    go = ctx.Event()
    procs: list[BaseProcess] = []
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            for _ in range(processes):
                proc = ctx.Process(target=target, args=(url, batch, ready, go, results))
                proc.daemon = True
                proc.start()
                procs.append(proc)
            _wait_ready(procs, ready, results, app)
            meter = CpuMeter()
            backends = backend_pids(conn, database, app)
            meter.start(backends)
            started = time.time()
            go.set()
            reports: list[dict[str, Any]] = []
            deadline = time.monotonic() + 600
            while len(reports) < processes:
                meter.sample(backends)
                with contextlib.suppress(queue.Empty):
                    reports.append(results.get(timeout=POLL))
                if time.monotonic() > deadline:
                    raise SetupError(f"{app} did not finish within 600 s")
            meter.sample(backends)
    finally:
        for child in procs:
            child.join(5)
            if child.is_alive():
                child.kill()
                child.join()
    errors = [r["error"] for r in reports if "error" in r]
    if errors:
        raise SetupError(f"{app} failed: {errors[0]}")
    return started, reports, meter.seconds


def _wait_ready(procs: list[BaseProcess], ready: Queue[Any], results: Queue[Any], app: str) -> None:
    """Wait until every child is connected; a child's failure ends the wait at once."""
    waiting = len(procs)
    deadline = time.monotonic() + 60
    while waiting:
        try:
            ready.get(timeout=POLL)
            waiting -= 1
            continue
        except queue.Empty:
            pass
        with contextlib.suppress(queue.Empty):
            report = results.get_nowait()
            raise SetupError(f"{app} failed before the start: {report.get('error', report)}")
        dead = [p.exitcode for p in procs if not p.is_alive()]
        if dead or time.monotonic() > deadline:
            raise SetupError(f"{app}: {waiting} processes not ready (exit codes {dead})")


# --- the three drains --------------------------------------------------------------------------


def scratch_database(name: str) -> str:
    with admin_connect() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    return database_url(name)


def minimal(rows: int, processes: int, batch: int) -> Result:
    name = DATABASE_PREFIX + "a"
    url = scratch_database(name)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(MINIMAL_SCHEMA)
        conn.execute(
            "INSERT INTO queue (status) SELECT 'pending' FROM generate_series(1, %s)", [rows]
        )
        conn.execute("VACUUM ANALYZE queue")
    started, reports, pg_cpu = run_processes(
        _minimal_loop, url, name, "bench-field-minimal", processes, batch
    )
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FILTER (WHERE status = 'done') FROM queue").fetchone()
    done = int(row[0]) if row else 0
    if done != rows or sum(r["rows"] for r in reports) != rows:
        raise SetupError(f"(a) drained {done:,} of {rows:,} rows")
    seconds = max(r["finished"] for r in reports) - started
    return Result(rows, seconds, sum(r["cpu"] for r in reports), pg_cpu, connections=processes)


def pgqueuer(rows: int, processes: int, batch: int) -> Result:
    try:
        import asyncpg
        from pgqueuer import AsyncpgDriver, Queries
    except ImportError as exc:
        raise SetupError(f"(b) needs PgQueuer: pip install -e '.[bench]' ({exc})") from exc
    name = DATABASE_PREFIX + "b"
    url = scratch_database(name)

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
    started, reports, pg_cpu = run_processes(
        _pgqueuer_worker, url, name, "bench-field-pgqueuer", processes, batch
    )
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*), extract(epoch FROM max(created))::float8 FROM pgqueuer_log"
            " WHERE status = 'successful'"
        ).fetchone()
        left = conn.execute("SELECT count(*) FROM pgqueuer").fetchone()
    assert row is not None
    assert left is not None
    if int(row[0]) != rows or int(left[0]) != 0:
        raise SetupError(f"(b) logged {row[0]:,} of {rows:,} jobs done; {left[0]:,} left")
    seconds = float(row[1]) - started
    return Result(rows, seconds, sum(r["cpu"] for r in reports), pg_cpu, connections=processes)


@contextlib.contextmanager
def notifier_workers(
    workdir: Path, concurrency: int, keep: bool, settings: dict[str, str]
) -> Iterator[tuple[Services, Conn, str]]:
    """A fresh notifier database, a worker (``--concurrency``) and beat with the default
    settings but ``settings``, ready. Yields them, an autocommit connection and the database's
    name."""
    name = DATABASE_PREFIX + "c"
    url = recreate_database(name)
    flush_redis(REDIS)
    tag = workdir / f"c-{concurrency}-{time.monotonic_ns()}"
    tag.mkdir()
    env = service_env(url, REDIS, tag, settings)
    services = Services(env, tag)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            services.start("worker", "worker", f"--concurrency={concurrency}", "--loglevel=WARNING")
            services.start(
                "beat", "beat", "--loglevel=WARNING", f"--schedule={tag / 'celerybeat-schedule'}"
            )
            wait_until(lambda: celery_ping(env), READY_TIMEOUT, "celery inspect ping", services)
            wait_until(lambda: waker_listening(conn, name), 30, "the wake-up listener", services)
            yield services, conn, name
            services.check_alive()
            problems = services.problems()
            if problems:
                print(f"    {len(problems)} warning/error log lines, e.g. {problems[0][:160]}")
    finally:
        services.stop()
        if not keep:
            drop_databases([name])


def redis_pid() -> int | None:
    """The Redis server's process id, when it runs on this machine."""
    client = redis.Redis.from_url(REDIS, socket_timeout=5)
    try:
        info: dict[str, Any] = client.info("server")  # type: ignore[assignment]
        pid = int(info["process_id"])
    finally:
        client.close()
    return pid if cpu_seconds(pid) is not None else None


def notifier_drain(
    rows: int, concurrency: int, workdir: Path, keep: bool, settings: dict[str, str]
) -> Result:
    """(c): ``rows`` due ``null`` rows drained by notifier's worker, default settings but
    ``settings``."""
    with notifier_workers(workdir, concurrency, keep, settings) as (services, conn, name):
        worker = services.pid("worker")
        workers, backends, redis_meter = CpuMeter(), CpuMeter(), CpuMeter()
        workers.start(process_tree(worker))
        backends.start(backend_pids(conn, name))
        server = redis_pid()
        redis_meter.start([server] if server else [])
        conn.execute(
            "INSERT INTO notifications (channel, recipient, subject, body)"
            " SELECT 'null', 'bench', 'field', 'row ' || g FROM generate_series(1, %s) AS g",
            (rows,),
        )
        row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        assert row is not None
        committed = float(row[0])
        connections = 0
        deadline = time.monotonic() + 60 + rows / 500
        while time.monotonic() < deadline:
            time.sleep(POLL)
            services.check_alive()
            workers.sample(process_tree(worker))
            pids = backend_pids(conn, name)
            connections = max(connections, len(pids))
            backends.sample(pids)
            redis_meter.sample(list(redis_meter.first))
            if not _unfinished(conn):
                break
        row = conn.execute(
            "SELECT count(*), extract(epoch FROM max(updated_at))::float8 FROM notifications"
            " WHERE status = 'sent'"
        ).fetchone()
    assert row is not None
    if int(row[0]) != rows:
        raise SetupError(f"(c) sent {row[0]:,} of {rows:,} rows")
    return Result(
        rows,
        float(row[1]) - committed,
        workers.seconds,
        backends.seconds,
        redis_meter.seconds,
        connections,
    )


def _unfinished(conn: Conn) -> bool:
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM notifications WHERE status = 'pending')"
        " OR EXISTS (SELECT 1 FROM notifications WHERE status = 'processing')"
    ).fetchone()
    return bool(row and row[0])


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


def compare(args: argparse.Namespace, workdir: Path) -> None:
    batch, processes, rows = args.batch, args.processes, args.rows
    default_batch = Settings.model_fields["batch_size"].default
    a = Series(f"(a) minimal table, {processes} procs, batch {batch}")
    b = Series(f"(b) PgQueuer 1.6, {processes} procs, batch {batch}")
    c = Series(f"(c) notifier, --concurrency={processes}, {describe(args.set)}")
    for round_ in range(1, args.repeat + 1):
        print(f"\nround {round_} of {args.repeat} (load {load()})", flush=True)
        a.results.append(minimal(rows, processes, batch))
        show("(a) minimal table", a.results[-1])
        b.results.append(pgqueuer(rows, processes, batch))
        show("(b) PgQueuer", b.results[-1])
        c.results.append(notifier_drain(rows, processes, workdir, args.keep, args.set))
        show("(c) notifier", c.results[-1])
    print(f"\n{rows:,} due rows each; median of {args.repeat} runs")
    for series in (a, b, c):
        print(series.line())
    batch_size = args.set.get("batch_size", f"{default_batch}, its default")
    print(f"  notifier ran with NOTIFIER_BATCH_SIZE={batch_size}; settings: {describe(args.set)}")
    print()
    for target, name, share in ((a, "(a)", TARGET_CEILING), (b, "(b)", TARGET_PGQUEUER)):
        ratio = c.median / target.median
        rounds = " ".join(
            f"{x.rate / y.rate:.2f}" for x, y in zip(c.results, target.results, strict=True)
        )
        verdict = "PASS" if ratio >= share else "FAIL"
        if args.set:
            verdict += " (the targets are for notifier's defaults)"
        print(
            f"  notifier / {name} = {ratio:.2f} (target >= {share}): {verdict};"
            f" round by round {rounds}"
        )


def scaling(args: argparse.Namespace, workdir: Path) -> None:
    levels: list[int] = args.scaling
    series = {n: Series(f"notifier, --concurrency={n}, {describe(args.set)}") for n in levels}
    for round_ in range(1, args.repeat + 1):
        print(f"\nround {round_} of {args.repeat} (load {load()})", flush=True)
        for n in levels:
            series[n].results.append(notifier_drain(args.rows, n, workdir, args.keep, args.set))
            show(f"--concurrency={n}", series[n].results[-1])
    print(f"\n{args.rows:,} due null rows each; median of {args.repeat} runs")
    for n in levels:
        most = max(r.connections for r in series[n].results)
        print(series[n].line() + f"; at most {most} connections")


def run(args: argparse.Namespace) -> int:
    command = shlex.join([sys.executable, *sys.argv])
    workdir = Path(tempfile.mkdtemp(prefix="notifier-bench-field-"))
    failed = False
    try:
        with admin_connect() as admin:
            pg = server_settings(admin, ["server_version", "shared_buffers", "synchronous_commit"])
        print(
            f"notifier against the field ({git_commit()}, Python {platform.python_version()},"
            f" {os.cpu_count()} CPUs, PostgreSQL {pg['server_version']}, shared_buffers"
            f" {pg['shared_buffers']}, synchronous_commit {pg['synchronous_commit']})"
        )
        print(f"load average at the start: {load()}")
        if args.scaling:
            scaling(args, workdir)
        else:
            compare(args, workdir)
        return 0
    except SetupError as exc:
        failed = True
        print(f"\nsetup failed: {exc}", file=sys.stderr)
        return 1
    except (psycopg.OperationalError, redis.RedisError) as exc:
        failed = True
        print(f"\nrun failed (was PostgreSQL or Redis restarted?): {exc}", file=sys.stderr)
        return 1
    finally:
        print(f"load average at the end: {load()}")
        print(f"command: {command}")
        if not args.keep:
            with contextlib.suppress(psycopg.Error):
                drop_databases(DATABASE_PREFIX + x for x in "abc")
            with contextlib.suppress(SetupError):
                flush_redis(REDIS)
        if args.keep or failed:
            print(f"kept logs in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _levels(value: str) -> list[int]:
    try:
        levels = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: expected e.g. 1,2,4") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: worker process counts are at least 1")
    return levels


def _setting(value: str) -> tuple[str, str]:
    name, sep, setting = value.partition("=")
    name = name.strip().upper().removeprefix("NOTIFIER_")
    if not sep or not name.replace("_", "").isalnum():
        raise argparse.ArgumentTypeError(f"{value!r}: expected NAME=VALUE, e.g. BATCH_SIZE=500")
    return name.lower(), setting


def describe(settings: dict[str, str]) -> str:
    """``defaults``, or the ``NOTIFIER_*`` settings given."""
    return " ".join(f"NOTIFIER_{k.upper()}={v}" for k, v in settings.items()) or "defaults"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="notifier against the field (see the docstring)")
    parser.add_argument("--rows", type=int, default=100_000, help="due rows per drain")
    parser.add_argument("--batch", type=int, default=500, help="batch of (a) and (b)")
    parser.add_argument("--processes", type=int, default=2, help="processes of (a), (b), (c)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each; the median counts")
    parser.add_argument(
        "--scaling", type=_levels, default=None, help="only notifier, with these worker counts"
    )
    parser.add_argument(
        "--set",
        type=_setting,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a NOTIFIER_<NAME> setting for notifier's worker (default: none, its defaults),"
        " e.g. --set BATCH_SIZE=500",
    )
    parser.add_argument("--keep", action="store_true", help="keep the databases and logs")
    args = parser.parse_args(argv)
    args.set = dict(args.set)
    if min(args.rows, args.batch, args.processes, args.repeat) < 1:
        parser.error("--rows, --batch, --processes and --repeat must be at least 1")
    return run_interruptibly(run, args)


if __name__ == "__main__":
    sys.exit(main())
