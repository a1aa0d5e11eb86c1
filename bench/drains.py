"""notifier's worker and beat on a benchmark's database, and what a drain of due rows shows.

``workers`` starts a worker and beat as production runs them and waits until they are ready;
``drain`` inserts due rows in one statement and polls until none is pending or processing,
sampling the worker's memory and the CPU of the worker, its PostgreSQL backends and Redis. The
time of a drain is the database's: from the INSERT's commit to the last sent row's
``updated_at``.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import psycopg
import redis

from bench.common import (
    Conn,
    CpuMeter,
    Services,
    backend_pids,
    celery_ping,
    cpu_seconds,
    flush_redis,
    load,
    proc_status_kib,
    process_tree,
    service_env,
    wait_until,
    waker_listening,
)
from bench.harness import CONCURRENCY, POLL, Bench, Result, describe_settings

READY_TIMEOUT = 90.0


@dataclass
class Drain:
    """Rows drained by workers: how many, how long (database clock), what else was seen."""

    rows: int
    sent: int
    seconds: float
    wall_seconds: float
    insert_seconds: float
    by_status: dict[str, int]
    timed_out: bool
    max_rss_kib: int = 0
    peak_hwm_kib: dict[str, int] = field(default_factory=dict)
    worker_cpu: float = 0.0
    postgres_cpu: float = 0.0
    redis_cpu: float = 0.0
    #: the most connections to the database (but the benchmark's) seen at once
    connections: int = 0
    batches: int = 0
    load: str = ""
    #: seconds from the INSERT's commit to the first recorded batch
    first_batch: float = math.nan
    #: per worker process (``claimed_by``): batches, first and last ``sent_at`` (Unix s)
    per_process: list[tuple[str, int, float, float]] = field(default_factory=list)
    #: sent rows that needed more than one attempt, and the last first-attempt ``sent_at``
    retried: int = 0
    first_attempts_seconds: float = math.nan

    @property
    def rate(self) -> float:
        return self.sent / self.seconds if self.seconds > 0 else math.nan

    def result(self) -> Result:
        return Result(
            self.sent,
            self.seconds,
            self.worker_cpu,
            self.postgres_cpu,
            self.redis_cpu,
            self.connections,
        )

    def describe(self) -> str:
        """Batches per worker process (a batch tops itself up while a backlog remains) and the
        seconds from its first send to its last."""
        parts = []
        for who, batches, first, last in self.per_process:
            many = "batch" if batches == 1 else "batches"
            parts.append(f"{who.rsplit(':', 1)[-1]}: {batches} {many}, {last - first:.1f}s sending")
        return "per process " + "; ".join(parts)


# --- the database's figures --------------------------------------------------------------------


def insert_due(
    conn: Conn, rows: int, channel: str, recipient: str, body: str | None = None
) -> tuple[float, float]:
    """INSERT ``rows`` due rows in one statement (one transaction; the trigger NOTIFYs once).
    ``{n}`` in ``recipient`` becomes each row's number (``u{n}@example.com``: one address a
    row); ``body``, when given, is every row's (a campaign's rows share it), else ``row N``.

    Returns (seconds the INSERT took, the database's clock right after its commit, Unix s).
    """
    started = time.monotonic()
    conn.execute(
        "INSERT INTO notifications (channel, recipient, subject, body)"
        " SELECT %s, replace(%s::text, '{n}', g::text), 'bench',"
        " coalesce(%s::text, 'row ' || g) FROM generate_series(1, %s) AS g",
        (channel, recipient, body, rows),
    )
    took = time.monotonic() - started
    row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
    assert row is not None
    return took, float(row[0])


def highest_id(conn: Conn) -> int:
    """The highest id in ``notifications`` (0 when empty): rows inserted after have higher."""
    row = conn.execute("SELECT coalesce(max(id), 0) FROM notifications").fetchone()
    return int(row[0]) if row else 0


def unfinished(conn: Conn) -> bool:
    """Is any row pending or processing? Each test walks one partial index from its start:
    ``notifications_due``, and ``notifications_lease`` (a processing row always has a lease).
    Without the lease's test the second is a scan of the whole table, every poll from the
    drain's last claim to its end: seconds of every core beside a drain on a big table."""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM notifications WHERE status = 'pending')"
        " OR EXISTS (SELECT 1 FROM notifications"
        "             WHERE status = 'processing' AND locked_until IS NOT NULL)"
    ).fetchone()
    return bool(row and row[0])


def status_counts(conn: Conn, ids: list[int] | None = None) -> dict[str, int]:
    """Rows by status: all of them, or those of ``ids``."""
    sql = "SELECT status, count(*) FROM notifications"
    if ids is not None:
        sql += " WHERE id = ANY(%s)"
    rows = conn.execute(sql + " GROUP BY status", None if ids is None else (ids,)).fetchall()
    return {str(s): int(n) for s, n in rows}


def per_process(conn: Conn) -> list[tuple[str, int, float, float]]:
    """Per ``claimed_by``: recorded batches, first and last ``sent_at`` (Unix s)."""
    rows = conn.execute(
        "SELECT claimed_by, count(DISTINCT claim_token), extract(epoch FROM min(sent_at))::float8,"
        " extract(epoch FROM max(sent_at))::float8 FROM notifications WHERE status = 'sent'"
        " GROUP BY claimed_by ORDER BY claimed_by"
    ).fetchall()
    return [(str(r[0]), int(r[1]), float(r[2]), float(r[3])) for r in rows]


def retries(conn: Conn) -> tuple[int, float | None]:
    """Sent rows that took more than one attempt; the latest ``sent_at`` of a first attempt."""
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE attempts > 1),"
        " extract(epoch FROM max(sent_at) FILTER (WHERE attempts = 1))::float8"
        " FROM notifications WHERE status = 'sent'"
    ).fetchone()
    if row is None:
        return 0, None
    return int(row[0]), None if row[1] is None else float(row[1])


def last_sent_epoch(conn: Conn) -> tuple[float | None, int]:
    """When the last sent row was recorded (its ``updated_at``, Unix s; ``sent_at`` is when its
    send ended, a little earlier), and how many batches (claims) sent rows."""
    row = conn.execute(
        "SELECT extract(epoch FROM max(updated_at))::float8, count(DISTINCT claim_token)"
        " FROM notifications WHERE status = 'sent'"
    ).fetchone()
    if row is None or row[0] is None:
        return None, 0
    return float(row[0]), int(row[1])


def redis_pid(url: str) -> int | None:
    """The Redis server's process id, when it runs on this machine."""
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        info = client.info("server")
        pid = int(info["process_id"])  # type: ignore[index]
    finally:
        client.close()
    return pid if cpu_seconds(pid) is not None else None


# --- worker and beat ---------------------------------------------------------------------------


@contextlib.contextmanager
def workers(
    bench: Bench,
    tag: str,
    database: str,
    url: str,
    settings: dict[str, str],
    concurrency: int = CONCURRENCY,
    environment: Mapping[str, str] | None = None,
) -> Iterator[tuple[Services, Conn]]:
    """A worker (``--concurrency``) and beat on database ``database`` with ``settings`` and
    ``--set``'s, and ``environment``'s other variables (an SDK's credentials, say), ready;
    stopped afterwards. Yields them and an autocommit connection to the database. Their
    warnings and errors become notes of the report."""
    flush_redis(bench.redis)
    settings = {**settings, **bench.args.set}
    workdir = bench.workdir / f"{tag}-{time.monotonic_ns()}"
    workdir.mkdir()
    env = {**service_env(url, bench.redis, workdir, settings), **(environment or {})}
    services = Services(env, workdir)
    conn: Conn | None = None
    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=10)
        services.start("worker", "worker", f"--concurrency={concurrency}", "--loglevel=WARNING")
        services.start(
            "beat", "beat", "--loglevel=WARNING", f"--schedule={workdir / 'celerybeat-schedule'}"
        )
        started = time.monotonic()
        db = conn
        wait_until(lambda: celery_ping(env), READY_TIMEOUT, "celery inspect ping", services)
        wait_until(lambda: waker_listening(db, database), 30, "the wake-up listener", services)
        print(
            f"  worker ready after {time.monotonic() - started:.1f}s"
            f" ({describe_settings(settings)})",
            flush=True,
        )
        yield services, conn
        services.check_alive()
        problems = services.problems()
        if problems:
            bench.notes.append(f"({tag}) {len(problems)} warning/error log lines, e.g.:")
            bench.notes += [f"    {line[:200]}" for line in problems[:3]]
    finally:
        if conn is not None:
            conn.close()
        services.stop()


def wait_drained(
    conn: Conn, services: Services, timeout: float, sample: Callable[[], None]
) -> bool:
    """Look every ``POLL`` seconds, after a ``sample()`` (of CPU, memory...), whether a row is
    still pending or processing, until none is or ``timeout`` seconds have passed; whether it
    timed out. A worker or beat that exited meanwhile raises a ``SetupError``."""
    started = time.monotonic()
    while True:
        time.sleep(POLL)
        sample()
        services.check_alive()
        if not unfinished(conn):
            return False
        if time.monotonic() - started > timeout:
            return True


def drain(
    conn: Conn,
    database: str,
    services: Services,
    rows: int,
    channel: str,
    recipient: str,
    timeout: float,
    redis_url: str | None = None,
    body: str | None = None,
) -> Drain:
    """Insert ``rows`` due rows and wait (at most ``timeout`` s) until none is pending or
    processing. With ``redis_url``, the Redis server's CPU is measured too."""
    worker = services.pid("worker")
    cpu_workers, cpu_backends, cpu_redis = CpuMeter(), CpuMeter(), CpuMeter()
    cpu_workers.start(process_tree(worker))
    cpu_backends.start(backend_pids(conn, database))
    server = redis_pid(redis_url) if redis_url else None
    cpu_redis.start([server] if server else [])
    max_rss = connections = 0
    hwm: dict[str, int] = {}

    def sample() -> None:
        nonlocal max_rss, connections
        tree = process_tree(worker)
        max_rss = max(max_rss, sum(proc_status_kib(p, "VmRSS") or 0 for p in tree))
        for pid in tree:
            label = "main" if pid == worker else f"child {pid}"
            hwm[label] = max(hwm.get(label, 0), proc_status_kib(pid, "VmHWM") or 0)
        cpu_workers.sample(tree)
        backends = backend_pids(conn, database)
        connections = max(connections, len(backends))
        cpu_backends.sample(backends)
        cpu_redis.sample(list(cpu_redis.first))

    insert_s, committed = insert_due(conn, rows, channel, recipient, body)
    started = time.monotonic()
    timed_out = wait_drained(conn, services, timeout, sample)
    wall = time.monotonic() - started
    last, batches = last_sent_epoch(conn)
    counts = status_counts(conn)
    processes = per_process(conn)
    first = min((p[2] for p in processes), default=math.nan)
    retried, last_first = retries(conn)
    return Drain(
        rows=rows,
        sent=counts.get("sent", 0),
        seconds=(last - committed) if last is not None else math.nan,
        wall_seconds=wall,
        insert_seconds=insert_s,
        by_status=counts,
        timed_out=timed_out,
        max_rss_kib=max_rss,
        peak_hwm_kib=hwm,
        worker_cpu=cpu_workers.seconds,
        postgres_cpu=cpu_backends.seconds,
        redis_cpu=cpu_redis.seconds,
        connections=connections,
        batches=batches,
        load=load(),
        first_batch=first - committed,
        per_process=processes,
        retried=retried,
        first_attempts_seconds=math.nan if last_first is None else last_first - committed,
    )
