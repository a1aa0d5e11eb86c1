"""Throughput of notifier on this machine: rows per second, against the database's ceiling.

What it measures
    1. **Raw ceiling**: plain psycopg loops that run only notifier's claim and mark-sent
       statements (the SQL text of ``notifier.db.queue.CLAIM_DUE`` and ``MARK_SENT``, with its
       ``:name`` parameters turned into psycopg's ``%(name)s``), batches of 500, one process
       per core (2), on a freshly migrated database (same table, indexes and trigger) holding
       ``--rows`` due rows. Rows per second, from the start signal to the last process done.
    2. **notifier end to end**: ``--rows`` due ``null`` rows, inserted in one
       ``INSERT ... SELECT generate_series`` once a worker (``--concurrency=2``) and beat are
       ready, drained by them. Time from the INSERT's commit (the database's clock) to the
       recording of the last sent row (its ``updated_at``); the bench polls every 0.2 s until
       no row is pending or processing.
       Rows per second, their ratio to (1), the worker processes' peak RSS (``VmRSS`` of the
       main process and its children, sampled every 0.2 s) and the CPU seconds used by the
       worker processes and by their PostgreSQL backends (``/proc/<pid>/stat``).
    3. **Campaign fan-out**: a campaign on the ``null`` channel, templates with a field and
       ``{code}``; a CSV of ``--rows-campaign`` recipients (default 1,000,000) written to a
       temp file first, then timed separately: ``Campaigns.import_audience``,
       ``generate_codes`` (as many codes as recipients) and ``launch`` (one notification per
       recipient written, each with the code at its recipient's position). The target is the
       launch; the import steps before it are shown beside it. No workers run. Its own fresh
       database.
    4. **Webhook**: ``--rows-webhook`` rows (default 20,000) on the ``webhook`` channel to a
       local HTTP/1.1 server (an asyncio protocol, keep-alive, in a process of its own) that
       answers 200 after 50 ms, drained by a worker with ``--concurrency=2``. Sends per second,
       as in (2) (a row retried after a failed send counts when it is finally sent); the server
       counts the requests it served, and its CPU is shown beside the worker's. Webhook sends
       run on each worker process's event loop: each ``NOTIFIER_ASYNC_SEND_CONCURRENCY`` of
       ``--send-concurrency`` (default ``100,200,400``) is tried with a fresh database and
       worker; the best is reported.
    5. **Rate limit**: ``NOTIFIER_RATE_LIMITS=null=500/s``, a worker with ``--concurrency=2``
       (two pool processes sharing the limit), notifier's default batch size unless
       ``--rate-batch-size``. 15,000 due ``null`` rows are inserted (30 s worth) and the bench
       looks after 22 s. From the database: rows per second by
       ``date_trunc('second', sent_at)`` over the 20 full seconds after the first send, their
       mean, the largest count in a calendar second and in any sliding 1 s window (``sent_at``
       is when each send ended, on the worker's clock). The bench also reads the limiter
       itself: Redis ``MONITOR`` shows every ``HSET`` the limiter's Lua script makes (tokens
       left, server time), from which each grant, i.e. each send (``null`` sends inline right
       after its grant), is reconstructed exactly. Both are shown.

Targets
    (2) at least 50 % of (1) (and with ``--million``, 1,000,000 rows sent in under 60 s);
    (3) under 20 s for import + codes + launch; (4) at least 2,000 sends/s; (5) the mean within
    5 % of 500/s and no 1 s window above 500 + one burst (50, the default burst of 500/s).
    The exit status is 0 whether the targets are met or not (it is a benchmark, not a test);
    1 if the set-up fails or PostgreSQL or Redis goes away; 130 when interrupted.

How to run it
    From the repository root, with PostgreSQL and Redis on localhost::

        python bench/throughput.py [--rows N] [--million] [--only 1,2,...] [--keep]

    Development: ``--rows 20000 --rows-campaign 100000``. A full run takes about ten minutes,
    most of it (3) and the tuning of (4). Each measurement gets its
    own database ``notifier_bench_tp_<n>`` (dropped and recreated, migrated with
    ``notifier.db.migrate.migrate``; ``NOTIFIER_BENCH_POSTGRES``, default
    ``postgresql://postgres@127.0.0.1:5432``), dropped right after it unless ``--keep``. Redis
    db 13 (``NOTIFIER_BENCH_REDIS``) is flushed before each measurement and at the end. Workers
    run exactly as production runs them, from the repository root::

        python -m celery -A notifier worker --concurrency=2 --loglevel=WARNING
        python -m celery -A notifier beat --loglevel=WARNING --schedule=<temp dir>/...

    with ``NOTIFIER_*`` variables from the calling shell left out, so that only the settings
    printed with each measurement apply (``NOTIFIER_BATCH_SIZE=500`` for (2) and (4)), plus any
    ``--set NAME=VALUE`` (e.g. ``--set RECORD_ATTEMPTS=false``, for diagnosis). Every process
    started (Celery processes in sessions of their own, the raw loops, the HTTP server) is
    stopped on exit, Ctrl-C or SIGTERM: SIGTERM first, SIGKILL to the process group after 20 s.

    Other load on the machine depresses every figure: the load average is printed at the start
    and with each measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import math
import multiprocessing
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection as Pipe
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # notifier and bench.common

import psycopg
import redis
from sqlalchemy import Engine, create_engine, event

from bench.common import (
    POSTGRES,
    Conn,
    CpuMeter,
    Services,
    SetupError,
    backend_pids,
    celery_ping,
    cpu_seconds,
    database_url,
    drop_databases,
    flush_redis,
    git_commit,
    load,
    proc_status_kib,
    process_tree,
    recreate_database,
    run_interruptibly,
    server_settings,
    service_env,
    sqlalchemy_url,
    wait_until,
    waker_listening,
)
from notifier.campaigns import Campaigns
from notifier.db import queue
from notifier.db.sql import for_driver, parameters

REDIS = os.environ.get("NOTIFIER_BENCH_REDIS", "redis://127.0.0.1:6379/13")
DATABASE_PREFIX = "notifier_bench_tp_"
BATCH = 500
PROCESSES = 2  # one per core on the 2-core machine this was written for
CONCURRENCY = 2
LEASE_SECONDS = 300
POLL = 0.2
READY_TIMEOUT = 90.0
#: (4): the receiver's answer time.
WEBHOOK_DELAY = 0.05
#: (5): the limit, the rows inserted, how long the bench watches and the window it judges.
RATE = 500
RATE_SPEC = f"null={RATE}/s"
RATE_BURST = math.ceil(
    RATE / 10
)  # notifier.delivery.ratelimit's default burst for a per-second window
RATE_ROWS = 15_000
RATE_WATCH_SECONDS = 22.0
RATE_WINDOW_SECONDS = 20
RATE_KEY = f"notifier:rate:null:{RATE}/s"
#: Targets.
E2E_SHARE = 0.5
MILLION_SECONDS = 60.0
CAMPAIGN_SECONDS = 20.0
WEBHOOK_TARGET = 2000.0
RATE_TOLERANCE = 0.05

CLAIM_SQL = queue.CLAIM_DUE  # written for the driver's cursor already
MARK_SENT_SQL = for_driver(str(queue.MARK_SENT))


def claim_params(token: uuid.UUID, worker: str, batch: int) -> dict[str, Any]:
    return queue.claim_parameters(token, worker, LEASE_SECONDS, batch, queue.ReadLimits())


def _mark_sent_values(
    token: uuid.UUID, worker: str, ids: list[int]
) -> dict[str, Callable[[], Any]]:
    """Every parameter the bench knows ``MARK_SENT`` to have taken, as notifier binds it."""
    return {
        "token": lambda: token,
        "ids": lambda: ids,
        "message_ids": lambda: [f"null-{i}" for i in ids],
        "providers": lambda: ["null"] * len(ids),
        "worker": lambda: worker,
        "durations": lambda: [0] * len(ids),
        "sent_at": lambda: [time.time()] * len(ids),
    }


_MARK_SENT_NAMES = parameters(str(queue.MARK_SENT))


def mark_sent_params(token: uuid.UUID, worker: str, ids: list[int]) -> dict[str, Any]:
    """What ``notifier.db.queue.mark_sent`` binds for these ``null`` rows: only the parameters the
    current ``MARK_SENT`` names (``check_raw_statements`` refuses names the bench does not know,
    rather than measure something else)."""
    values = _mark_sent_values(token, worker, ids)
    return {name: values[name]() for name in _MARK_SENT_NAMES}


def check_raw_statements() -> None:
    """Refuse to run (1) if notifier's statements take parameters the raw loop cannot bind."""
    claim_names = set(re.findall(r"%\((\w+)\)s", CLAIM_SQL))
    unknown = claim_names - set(claim_params(uuid.uuid4(), "", 1))
    unknown |= _MARK_SENT_NAMES - set(_mark_sent_values(uuid.uuid4(), "", []))
    if unknown:
        raise SetupError(
            f"notifier.db.queue.CLAIM_DUE/MARK_SENT now take {sorted(unknown)}; teach"
            " bench/throughput.py's raw loop what notifier binds there"
        )


def fmt_int(value: float) -> str:
    return f"{value:,.0f}" if math.isfinite(value) else "-"


# --- results -----------------------------------------------------------------------------------


@dataclass
class Line:
    """One line of the final table."""

    measurement: str
    value: str
    target: str = "-"
    result: str = ""


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


def describe(d: Drain) -> str:
    """Batches per worker process and their mean cycle (claim, send, record) in ms."""
    parts = []
    for who, batches, first, last in d.per_process:
        cycle = (last - first) / (batches - 1) * 1000 if batches > 1 else math.nan
        parts.append(f"{who.rsplit(':', 1)[-1]}: {batches} batches, {cycle:.0f} ms apart")
    return "per process " + "; ".join(parts)


# --- database helpers --------------------------------------------------------------------------


def insert_due(conn: Conn, rows: int, channel: str, recipient: str) -> tuple[float, float]:
    """INSERT ``rows`` due rows in one statement (one transaction; the trigger NOTIFYs once).

    Returns (seconds the INSERT took, the database's clock right after its commit, Unix s).
    """
    started = time.monotonic()
    conn.execute(
        "INSERT INTO notifications (channel, recipient, subject, body)"
        " SELECT %s, %s, 'throughput', 'row ' || g FROM generate_series(1, %s) AS g",
        (channel, recipient, rows),
    )
    took = time.monotonic() - started
    row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
    assert row is not None
    return took, float(row[0])


def unfinished(conn: Conn) -> bool:
    """Is any row pending or processing? Each test walks one partial index from its start."""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM notifications WHERE status = 'pending')"
        " OR EXISTS (SELECT 1 FROM notifications WHERE status = 'processing')"
    ).fetchone()
    return bool(row and row[0])


def status_counts(conn: Conn) -> dict[str, int]:
    rows = conn.execute("SELECT status, count(*) FROM notifications GROUP BY status").fetchall()
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


# --- 1: the raw ceiling ------------------------------------------------------------------------


def _raw_loop(
    url: str, batch: int, ready: Queue[Any], go: Event, results: Queue[Any]
) -> None:  # pragma: no cover - runs in a child process
    """Claim and mark sent until nothing is left; report rows, finish time and time spent."""
    try:
        conn = psycopg.connect(url, application_name="bench-raw", connect_timeout=10)
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        conn.commit()
        backend = int(row[0]) if row else 0
        worker = f"bench-raw:{os.getpid()}"
        ready.put(os.getpid())
        go.wait()
        cpu0 = time.process_time()
        rows = batches = 0
        claim_s = mark_s = 0.0
        with conn.cursor() as cur:
            while True:
                token = uuid.uuid4()
                t0 = time.perf_counter()
                cur.execute(CLAIM_SQL, claim_params(token, worker, batch))
                claimed = cur.fetchall()
                conn.commit()
                t1 = time.perf_counter()
                claim_s += t1 - t0
                if not claimed:
                    break
                ids = [int(r[0]) for r in claimed]
                cur.execute(MARK_SENT_SQL, mark_sent_params(token, worker, ids))
                conn.commit()
                mark_s += time.perf_counter() - t1
                rows += cur.rowcount if cur.rowcount >= 0 else len(ids)
                batches += 1
        finished = time.monotonic()
        results.put(
            {
                "pid": os.getpid(),
                "rows": rows,
                "batches": batches,
                "finished": finished,
                "cpu": time.process_time() - cpu0,
                "backend": backend,
                "claim_s": claim_s,
                "mark_s": mark_s,
            }
        )
        conn.close()
    except BaseException as exc:  # report, don't hang the parent
        results.put({"pid": os.getpid(), "error": f"{type(exc).__name__}: {exc}"})


@dataclass
class RawResult:
    rows: int
    seconds: float
    batches: int
    claim_s: float
    mark_s: float
    client_cpu: float
    postgres_cpu: float
    load: str

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else math.nan


# --- 4: the webhook receiver -------------------------------------------------------------------


class _WebhookReceiver(asyncio.Protocol):  # pragma: no cover - runs in a child process
    """One keep-alive HTTP/1.1 connection: each request (its head, then ``Content-Length`` bytes
    of body) is answered ``200`` after ``delay`` s, in order; ``Connection: close`` is honoured.

    A protocol rather than asyncio streams, and a timer per request rather than a task: the
    receiver shares the machine's two cores with the worker it measures, so it is kept lean.
    """

    def __init__(
        self, delay: float, served: Synchronized[int], connections: Synchronized[int]
    ) -> None:
        self.delay = delay
        self.served = served
        self.connections = connections
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.connections.value += 1

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            length, close = _length_and_close(self.buffer[:end])
            if len(self.buffer) < end + 4 + length:
                return  # the body is still on its way
            self.buffer = self.buffer[end + 4 + length :]
            asyncio.get_running_loop().call_later(self.delay, self.answer, close)

    def answer(self, close: bool) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        self.served.value += 1
        if close:
            self.transport.close()


def _length_and_close(head: bytes) -> tuple[int, bool]:
    """A request head's ``Content-Length``, and whether it asks to close the connection."""
    length, close = 0, False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"connection" and value.strip().lower() == b"close":
            close = True
    return length, close


def _serve_webhooks(
    port: Pipe, served: Synchronized[int], connections: Synchronized[int], delay: float
) -> None:  # pragma: no cover - runs in a child process
    """An HTTP/1.1 server on loopback that answers every request 200 after ``delay`` s."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops it

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _WebhookReceiver(delay, served, connections), "127.0.0.1", 0, backlog=1024
        )
        port.send(server.sockets[0].getsockname()[1])
        port.close()
        async with server:
            await server.serve_forever()

    asyncio.run(main())


@dataclass
class WebhookServer:
    """The receiver of (4), in a process of its own so it has its own GIL."""

    delay: float
    process: BaseProcess | None = None
    port: int = 0
    _served: Synchronized[int] | None = None
    _connections: Synchronized[int] | None = None

    def start(self) -> WebhookServer:
        ctx = multiprocessing.get_context("spawn")
        self._served = ctx.Value("q", 0, lock=False)
        self._connections = ctx.Value("q", 0, lock=False)
        ours, theirs = ctx.Pipe(duplex=False)
        self.process = ctx.Process(
            target=_serve_webhooks,
            args=(theirs, self._served, self._connections, self.delay),
            name="bench-webhook-server",
            daemon=True,
        )
        self.process.start()
        theirs.close()
        if not ours.poll(30):
            raise SetupError("the webhook server did not start within 30 s")
        self.port = int(ours.recv())
        ours.close()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    @property
    def served(self) -> int:
        return int(self._served.value) if self._served is not None else 0

    @property
    def connections(self) -> int:
        return int(self._connections.value) if self._connections is not None else 0

    @property
    def cpu_seconds(self) -> float:
        """CPU the receiver's process has used so far (it shares the cores with the worker)."""
        pid = self.process.pid if self.process is not None else None
        return (cpu_seconds(pid) or 0.0) if pid is not None else 0.0

    def stop(self) -> None:
        if self.process is not None and self.process.is_alive():
            self.process.terminate()
            self.process.join(5)
            if self.process.is_alive():
                self.process.kill()
                self.process.join()


# --- 5: the limiter's grants, read from Redis MONITOR -------------------------------------------

_HSET = re.compile(
    rb'^\+(\d+\.\d+) \[(\d+) lua\] "HSET" "([^"]+)" "tokens" "([^"]+)" "ts" "([^"]+)"'
)


class GrantRecorder(threading.Thread):
    """Every write of one rate-limit bucket, from ``MONITOR``: (server ms, tokens left).

    A raw socket, so the thread can stop at once. MONITOR shows the whole server's traffic;
    only the limiter's ``HSET`` on ``key`` in the benchmark's db is kept.
    """

    def __init__(self, redis_url: str, key: str) -> None:
        super().__init__(name="bench-grant-recorder", daemon=True)
        url = urlsplit(redis_url)
        self._address = (url.hostname or "127.0.0.1", url.port or 6379)
        self._db = (url.path.strip("/") or "0").encode()
        self._key = key.encode()
        self._halt = threading.Event()
        self._ready = threading.Event()
        self.writes: list[tuple[float, float]] = []
        self.error: str | None = None

    def start_and_wait(self) -> None:
        self.start()
        if not self._ready.wait(10):
            raise SetupError(f"Redis MONITOR did not start: {self.error}")

    def stop(self) -> None:
        self._halt.set()
        self.join(5)

    def run(self) -> None:
        try:
            with socket.create_connection(self._address, timeout=5) as sock:
                sock.sendall(b"MONITOR\r\n")
                sock.settimeout(0.2)
                buffer = b""
                while not self._halt.is_set():
                    try:
                        data = sock.recv(1 << 16)
                    except TimeoutError:
                        continue
                    if not data:
                        raise ConnectionError("Redis closed the MONITOR connection")
                    buffer += data
                    *lines, buffer = buffer.split(b"\r\n")
                    for line in lines:
                        if line == b"+OK":
                            self._ready.set()
                            continue
                        match = _HSET.match(line)
                        if match and match[2] == self._db and match[3] == self._key:
                            self.writes.append((float(match[5]), float(match[4])))
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    def grants(self, rate_per_ms: float, capacity: float) -> list[tuple[float, int]]:
        """(server time in s, tokens granted) of every acquire that granted some.

        Replays the bucket: before a write it held ``min(capacity, left + elapsed * rate)``
        (a bucket not written yet, or expired, is full); what the write left is the rest.
        """
        grants = []
        tokens, ts = float(capacity), None
        for now, left in self.writes:
            available = capacity if ts is None else min(capacity, tokens + (now - ts) * rate_per_ms)
            granted = round(available - left)
            if granted > 0:
                grants.append((now / 1000.0, granted))
            tokens, ts = left, now
        return grants


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


# --- 3: where a launch's time goes -------------------------------------------------------------


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


# --- the benchmark -----------------------------------------------------------------------------


@dataclass
class Bench:
    args: argparse.Namespace
    workdir: Path
    databases: list[str] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)
    settings_used: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    raw: RawResult | None = None
    _cleanups: list[Callable[[], None]] = field(default_factory=list)

    # -- plumbing ---------------------------------------------------------------------------------

    def database(self, number: int) -> tuple[str, str]:
        name = f"{DATABASE_PREFIX}{number}"
        if name not in self.databases:
            self.databases.append(name)
        return name, recreate_database(name)

    def done_with(self, name: str) -> None:
        if not self.args.keep:
            drop_databases([name])

    @contextlib.contextmanager
    def workers(
        self,
        tag: str,
        database: str,
        url: str,
        settings: dict[str, str],
        concurrency: int = CONCURRENCY,
    ) -> Iterator[tuple[Services, Conn]]:
        """A worker (``--concurrency``) and beat on database ``database``, ready; stopped
        afterwards. Yields them and an autocommit connection to the database."""
        flush_redis(REDIS)
        settings = {**settings, **self.args.set}
        workdir = self.workdir / tag
        workdir.mkdir()
        env = service_env(url, REDIS, workdir, settings)
        services = Services(env, workdir)
        conn: Conn | None = None
        try:
            conn = psycopg.connect(url, autocommit=True, connect_timeout=10)
            services.start("worker", "worker", f"--concurrency={concurrency}", "--loglevel=WARNING")
            services.start(
                "beat",
                "beat",
                "--loglevel=WARNING",
                f"--schedule={workdir / 'celerybeat-schedule'}",
            )
            started = time.monotonic()
            db = conn
            wait_until(lambda: celery_ping(env), READY_TIMEOUT, "celery inspect ping", services)
            wait_until(lambda: waker_listening(db, database), 30, "the wake-up listener", services)
            shown = " ".join(f"NOTIFIER_{k.upper()}={v}" for k, v in settings.items())
            print(f"  worker ready after {time.monotonic() - started:.1f}s ({shown})", flush=True)
            yield services, conn
            services.check_alive()
            problems = services.problems()
            if problems:
                self.notes.append(f"({tag}) {len(problems)} warning/error log lines, e.g.:")
                self.notes += [f"    {line[:200]}" for line in problems[:3]]
        finally:
            if conn is not None:
                conn.close()
            services.stop()

    def drain(
        self,
        conn: Conn,
        database: str,
        services: Services,
        rows: int,
        channel: str,
        to: str,
        timeout: float,
    ) -> Drain:
        """Insert ``rows`` due rows and wait (at most ``timeout`` s) until none is pending or
        processing."""
        worker = services.pid("worker")
        cpu_workers, cpu_backends = CpuMeter(), CpuMeter()
        cpu_workers.start(process_tree(worker))
        cpu_backends.start(backend_pids(conn, database))
        insert_s, committed = insert_due(conn, rows, channel, to)
        started = time.monotonic()
        max_rss = 0
        hwm: dict[str, int] = {}
        timed_out = False
        polls = 0
        while True:
            time.sleep(POLL)
            polls += 1
            tree = process_tree(worker)
            max_rss = max(max_rss, sum(proc_status_kib(p, "VmRSS") or 0 for p in tree))
            for pid in tree:
                label = "main" if pid == worker else f"child {pid}"
                hwm[label] = max(hwm.get(label, 0), proc_status_kib(pid, "VmHWM") or 0)
            cpu_workers.sample(tree)
            if polls % 5 == 0:
                cpu_backends.sample(backend_pids(conn, database))
            else:
                cpu_backends.sample(list(cpu_backends.last))
            services.check_alive()
            if not unfinished(conn):
                break
            if time.monotonic() - started > timeout:
                timed_out = True
                break
        wall = time.monotonic() - started
        cpu_backends.sample(backend_pids(conn, database))
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
            batches=batches,
            load=load(),
            first_batch=first - committed,
            per_process=processes,
            retried=retried,
            first_attempts_seconds=math.nan if last_first is None else last_first - committed,
        )

    # -- 1 --------------------------------------------------------------------------------------

    def raw_ceiling(self) -> None:
        rows = self.args.rows
        print(f"\n1. raw ceiling: claim + mark-sent, {PROCESSES} processes, batch {BATCH}")
        check_raw_statements()
        name, url = self.database(1)
        ctx = multiprocessing.get_context("spawn")
        ready: Queue[Any] = ctx.Queue()
        results: Queue[Any] = ctx.Queue()
        go = ctx.Event()
        procs: list[BaseProcess] = []
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                insert_s, _ = insert_due(conn, rows, "null", "bench")
                print(f"  inserted {rows:,} due rows in {insert_s:.1f}s", flush=True)
                for _ in range(PROCESSES):
                    proc = ctx.Process(
                        target=_raw_loop, args=(url, BATCH, ready, go, results), daemon=True
                    )
                    proc.start()
                    procs.append(proc)
                for _ in procs:
                    ready.get(timeout=60)
                backends = backend_pids(conn, name, "bench-raw")
                meter = CpuMeter()
                meter.start(backends)
                started = time.monotonic()
                go.set()
                reports: list[dict[str, Any]] = []
                deadline = started + 60 + rows / 500
                while len(reports) < len(procs):
                    meter.sample(backends)
                    with contextlib.suppress(Exception):
                        reports.append(results.get(timeout=0.2))
                    if time.monotonic() > deadline:
                        raise SetupError("the raw loops did not finish in time")
                meter.sample(backends)
                errors = [r["error"] for r in reports if "error" in r]
                if errors:
                    raise SetupError(f"a raw loop failed: {errors[0]}")
                counts = status_counts(conn)
        finally:
            for started_proc in procs:
                started_proc.join(5)
                if started_proc.is_alive():
                    started_proc.kill()
                    started_proc.join()
        seconds = max(r["finished"] for r in reports) - started
        raw = RawResult(
            rows=sum(r["rows"] for r in reports),
            seconds=seconds,
            batches=sum(r["batches"] for r in reports),
            claim_s=sum(r["claim_s"] for r in reports),
            mark_s=sum(r["mark_s"] for r in reports),
            client_cpu=sum(r["cpu"] for r in reports),
            postgres_cpu=meter.seconds,
            load=load(),
        )
        self.raw = raw
        self.done_with(name)
        if counts.get("sent", 0) != rows:
            self.notes.append(f"(1) not every row ended sent: {counts}")
        print(
            f"  {raw.rows:,} rows in {raw.seconds:.2f}s = {fmt_int(raw.rate)} rows/s;"
            f" {raw.batches} batches, per batch: claim {raw.claim_s / raw.batches * 1000:.1f} ms,"
            f" mark-sent {raw.mark_s / raw.batches * 1000:.1f} ms (wall, per process)"
        )
        print(
            f"  CPU: client processes {raw.client_cpu:.1f}s, their PostgreSQL backends"
            f" {raw.postgres_cpu:.1f}s; load average {raw.load}"
        )
        self.lines.append(
            Line(
                f"1 raw ceiling (claim+mark-sent, {PROCESSES} procs)",
                f"{fmt_int(raw.rate)} rows/s",
            )
        )

    # -- 2 --------------------------------------------------------------------------------------

    def end_to_end(self) -> None:
        rows = self.args.rows
        pool = self.args.concurrency
        print(f"\n2. notifier end to end: {rows:,} null rows, worker --concurrency={pool}")
        name, url = self.database(2)
        settings = {"batch_size": str(BATCH)}
        self.settings_used.append(f"(2) NOTIFIER_BATCH_SIZE={BATCH}")
        with self.workers("e2e", name, url, settings, pool) as (services, conn):
            d = self.drain(conn, name, services, rows, "null", "bench", 60 + rows / 500)
        self.done_with(name)
        print(
            f"  inserted in {d.insert_seconds:.1f}s; {d.sent:,} of {rows:,} sent in"
            f" {d.seconds:.2f}s (commit to the last row recorded; {d.wall_seconds:.1f}s by polling)"
            f" = {fmt_int(d.rate)} rows/s in {d.batches} recorded batches"
        )
        print(f"  first batch recorded {d.first_batch:.2f}s after the commit; {describe(d)}")
        hwm = ", ".join(f"{k} {v / 1024:.0f} MiB" for k, v in d.peak_hwm_kib.items())
        print(f"  worker RSS: max sum {d.max_rss_kib / 1024:.0f} MiB; peak per process: {hwm}")
        print(
            f"  CPU during the drain: worker processes {d.worker_cpu:.1f}s, PostgreSQL backends"
            f" {d.postgres_cpu:.1f}s; load average {d.load}"
        )
        if d.timed_out or d.sent != rows:
            print(f"  NOT ALL SENT: {d.by_status}{' (timed out)' if d.timed_out else ''}")
        raw = self.raw
        if raw is not None:
            share = d.rate / raw.rate
            verdict = "PASS" if share >= E2E_SHARE and not d.timed_out else "FAIL"
            result = f"{verdict} ({share:.0%} of (1))"
            print(
                f"  per row: notifier {d.worker_cpu / max(d.sent, 1) * 1e6:.0f} us worker CPU +"
                f" {d.postgres_cpu / max(d.sent, 1) * 1e6:.0f} us PostgreSQL CPU;"
                f" raw {raw.client_cpu / raw.rows * 1e6:.0f} us client +"
                f" {raw.postgres_cpu / raw.rows * 1e6:.0f} us PostgreSQL"
            )
        else:
            result = "n/a (run 1 too)"
        self.lines.append(
            Line(
                f"2 notifier end to end (null, {rows:,} rows)",
                f"{fmt_int(d.rate)} rows/s",
                f">= {E2E_SHARE:.0%} of (1)",
                result,
            )
        )
        self.lines.append(
            Line(
                f"   worker RSS, max (main + {pool} pool processes)",
                f"{d.max_rss_kib / 1024:.0f} MiB",
            )
        )
        if rows >= 1_000_000:
            ok = d.seconds < MILLION_SECONDS and d.sent == rows
            self.lines.append(
                Line(
                    f"   {rows:,} null rows sent, in all",
                    f"{d.seconds:.1f} s",
                    f"< {MILLION_SECONDS:.0f} s",
                    "PASS" if ok else "FAIL",
                )
            )

    # -- 3 --------------------------------------------------------------------------------------

    def campaign(self) -> None:
        count = self.args.rows_campaign
        print(f"\n3. campaign fan-out: {count:,} recipients with codes (no workers)")
        name, url = self.database(3)
        path = self.workdir / "audience.csv"
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
        self.done_with(name)
        enqueued, with_code, distinct = (int(v) for v in row)
        total = sum(s for _, s in steps)
        launch = steps[-1][1]
        print(
            f"  {enqueued:,} notifications enqueued, {with_code:,} with a code ({distinct:,}"
            f" distinct); import + codes + launch {total:.1f}s; load average {load()}"
        )
        ok = launch < CAMPAIGN_SECONDS and enqueued == count == with_code == distinct
        self.lines.append(
            Line(
                f"3 campaign fan-out ({count:,} with codes)",
                f"{launch:.1f} s",
                f"< {CAMPAIGN_SECONDS:.0f} s",
                "PASS" if ok else "FAIL",
            )
        )
        for step, seconds in steps:
            self.lines.append(Line(f"   {step}", f"{seconds:.1f} s"))
        self.lines.append(Line("   import + codes + launch", f"{total:.1f} s"))
        self.notes.append(
            "(3) is the launch: the audience and its code pool are in the database before it,"
            " as they are when an operator launches"
        )

    # -- 4 --------------------------------------------------------------------------------------

    def webhook(self) -> None:
        rows = self.args.rows_webhook
        levels = [int(v) for v in self.args.send_concurrency.split(",")]
        print(f"\n4. webhook: {rows:,} rows to a receiver answering after 50 ms")
        best: tuple[float, int, Drain, int, int] | None = None
        for level in levels:
            name, url = self.database(4)
            server = WebhookServer(WEBHOOK_DELAY).start()
            try:
                settings = {
                    "batch_size": str(BATCH),
                    "async_send_concurrency": str(level),
                    "webhook_allow_http": "true",
                    "webhook_allowed_networks": "127.0.0.0/8,::1/128",
                }
                workers = self.workers(
                    f"webhook-{level}", name, url, settings, self.args.concurrency
                )
                with workers as (services, conn):
                    server_cpu = server.cpu_seconds
                    d = self.drain(
                        conn, name, services, rows, "webhook", server.url, 60 + rows / 50
                    )
                    server_cpu = server.cpu_seconds - server_cpu
                served, connections = server.served, server.connections
            finally:
                server.stop()
            self.done_with(name)
            print(
                f"  NOTIFIER_ASYNC_SEND_CONCURRENCY={level}: {d.sent:,} sent in"
                f" {d.seconds:.2f}s = {fmt_int(d.rate)}/s; the server served {served:,} requests"
                f" on {connections:,} connections; CPU: worker {d.worker_cpu:.1f}s, PostgreSQL"
                f" {d.postgres_cpu:.1f}s, receiver {server_cpu:.1f}s; load average {d.load}",
                flush=True,
            )
            print(f"    first batch {d.first_batch:.2f}s after the commit; {describe(d)}")
            if d.retried:
                first_rate = (d.sent - d.retried) / d.first_attempts_seconds
                print(
                    f"    {d.retried} rows needed a second attempt (see last_error; a retry"
                    f" waits NOTIFIER_RETRY_BASE_SECONDS); first attempts alone:"
                    f" {fmt_int(first_rate)}/s"
                )
            if d.sent != rows:
                print(f"    NOT ALL SENT: {d.by_status}{' (timed out)' if d.timed_out else ''}")
            if best is None or d.rate > best[0]:
                best = (d.rate, level, d, served, connections)
        assert best is not None
        rate, level, d, served, connections = best
        self.settings_used.append(
            f"(4) NOTIFIER_ASYNC_SEND_CONCURRENCY={level} (best of"
            f" {self.args.send_concurrency}),"
            f" NOTIFIER_BATCH_SIZE={BATCH}, NOTIFIER_WEBHOOK_ALLOW_HTTP=true,"
            " NOTIFIER_WEBHOOK_ALLOWED_NETWORKS=127.0.0.0/8,::1/128"
        )
        ok = rate >= WEBHOOK_TARGET and d.sent == rows
        self.lines.append(
            Line(
                f"4 webhook, 50 ms receiver (concurrency {level})",
                f"{fmt_int(rate)} sends/s",
                f">= {fmt_int(WEBHOOK_TARGET)}/s",
                "PASS" if ok else "FAIL",
            )
        )
        if served != d.sent:
            self.notes.append(f"(4) the server served {served:,} requests for {d.sent:,} rows")

    # -- 5 --------------------------------------------------------------------------------------

    def rate_limit(self) -> None:
        batch = self.args.rate_batch_size  # None: notifier's default
        print(
            f"\n5. rate limit {RATE_SPEC}: {RATE_ROWS:,} rows, {CONCURRENCY} pool processes,"
            f" watched for {RATE_WATCH_SECONDS:.0f}s"
        )
        name, url = self.database(5)
        settings = {"rate_limits": RATE_SPEC}
        if batch is not None:
            settings["batch_size"] = str(batch)
        self.settings_used.append(
            f"(5) NOTIFIER_RATE_LIMITS={RATE_SPEC}, NOTIFIER_BATCH_SIZE="
            + (str(batch) if batch is not None else "unset (notifier's default, 100)")
        )
        recorder = GrantRecorder(REDIS, RATE_KEY)
        with self.workers("rate", name, url, settings) as (_, conn):
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
        self.done_with(name)
        if recorder.error:
            self.notes.append(f"(5) Redis MONITOR failed: {recorder.error}")
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
        self.lines.append(
            Line(
                f"5 rate limit {RATE}/s, 2 processes, {RATE_WINDOW_SECONDS} s",
                f"{db_mean:.0f}/s ({db_dev:+.1%})",
                f"within {RATE_TOLERANCE:.0%}",
                "PASS" if abs(db_dev) <= RATE_TOLERANCE else "FAIL",
            )
        )
        self.lines.append(
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
            self.lines.append(
                Line(
                    "   sends by grant time (limiter), mean",
                    f"{g_mean:.0f}/s ({g_dev:+.1%})",
                    f"within {RATE_TOLERANCE:.0%}",
                    "PASS" if abs(g_dev) <= RATE_TOLERANCE else "FAIL",
                )
            )
            self.lines.append(
                Line(
                    "   max in any 1 s window (grant time)",
                    f"{g_sliding}",
                    f"<= {limit}",
                    "PASS" if g_sliding <= limit else "FAIL",
                )
            )
        else:
            self.notes.append("(5) no grant was seen in Redis MONITOR")

    # -- report -----------------------------------------------------------------------------------

    def report(self, command: str) -> None:
        if self.args.concurrency != CONCURRENCY:
            self.settings_used.append(
                f"(2) and (4) ran celery worker --concurrency={self.args.concurrency}"
            )
        if self.args.set:
            extra = " ".join(f"NOTIFIER_{k.upper()}={v}" for k, v in self.args.set.items())
            self.settings_used.append(f"every worker also got (--set): {extra}")
        print()
        print(f"{'measurement':<46}{'value':<16}{'target':<16}result")
        for line in self.lines:
            print(f"{line.measurement:<46}{line.value:<16}{line.target:<16}{line.result}".rstrip())
        print()
        for setting in self.settings_used:
            print(f"settings {setting}")
        for note in self.notes:
            print(f"note {note}")
        print(f"load average at the end: {load()}")
        print(f"command: {command}")


def run(args: argparse.Namespace) -> int:
    command = shlex.join([sys.executable, *sys.argv])
    workdir = Path(tempfile.mkdtemp(prefix="notifier-bench-throughput-"))
    bench = Bench(args, workdir)
    failed = False
    try:
        print(
            f"notifier throughput benchmark ({git_commit()}, Python {platform.python_version()},"
            f" {os.cpu_count()} CPUs, load average {load()})"
        )
        flush_redis(REDIS)
        with psycopg.connect(database_url("postgres"), autocommit=True) as admin:
            pg = server_settings(
                admin,
                ["server_version", "shared_buffers", "synchronous_commit", "autovacuum"],
            )
        print(
            f"  PostgreSQL {pg['server_version']} on {POSTGRES} (shared_buffers"
            f" {pg['shared_buffers']}, synchronous_commit {pg['synchronous_commit']},"
            f" autovacuum {pg['autovacuum']}); Redis {REDIS}; logs {workdir}"
        )
        steps: dict[int, Callable[[], None]] = {
            1: bench.raw_ceiling,
            2: bench.end_to_end,
            3: bench.campaign,
            4: bench.webhook,
            5: bench.rate_limit,
        }
        for number in args.only:
            steps[number]()
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
                flush_redis(REDIS)
        if args.keep or failed:
            print(f"kept logs in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _only(value: str) -> list[int]:
    try:
        numbers = sorted({int(v) for v in value.split(",") if v.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: expected e.g. 1,2,5") from None
    if not numbers or any(n not in range(1, 6) for n in numbers):
        raise argparse.ArgumentTypeError(f"{value!r}: measurements are numbered 1 to 5")
    return numbers


def _setting(value: str) -> tuple[str, str]:
    name, sep, setting = value.partition("=")
    name = name.strip().upper().removeprefix("NOTIFIER_")
    if not sep or not re.fullmatch(r"[A-Z0-9_]+", name):
        raise argparse.ArgumentTypeError(f"{value!r}: expected NAME=VALUE, e.g. BATCH_SIZE=200")
    return name.lower(), setting


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Measure notifier's throughput against the database's ceiling (see the"
        " docstring)."
    )
    parser.add_argument("--rows", type=int, default=100_000, help="due rows for (1) and (2)")
    parser.add_argument("--million", action="store_true", help="1,000,000 rows for (1) and (2)")
    parser.add_argument("--only", type=_only, default=[1, 2, 3, 4, 5], help="e.g. 1,2")
    parser.add_argument("--rows-campaign", type=int, default=1_000_000, help="recipients of (3)")
    parser.add_argument("--rows-webhook", type=int, default=20_000, help="rows of (4)")
    parser.add_argument(
        "--send-concurrency",
        default="100,200,400",
        help="NOTIFIER_ASYNC_SEND_CONCURRENCY for (4); each of a comma-separated list is tried",
    )
    parser.add_argument(
        "--rate-batch-size",
        type=int,
        default=None,
        help="NOTIFIER_BATCH_SIZE for (5) (default: unset, notifier's own default)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=CONCURRENCY,
        help=f"worker pool processes for (2) and (4) (default {CONCURRENCY}; (5) always uses 2)",
    )
    parser.add_argument(
        "--set",
        type=_setting,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="one more NOTIFIER_<NAME> setting for every worker (diagnosis), e.g."
        " --set RECORD_ATTEMPTS=false",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the databases, Redis db and logs afterwards"
    )
    args = parser.parse_args(argv)
    args.set = dict(args.set)
    if args.million:
        args.rows = 1_000_000
    if min(args.rows, args.rows_campaign, args.rows_webhook, args.rate_batch_size or 1) < 1:
        parser.error("row counts and the batch size must be at least 1")
    if args.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    try:
        [int(v) for v in args.send_concurrency.split(",")]
    except ValueError:
        parser.error("--send-concurrency takes integers, e.g. 100,200,400")
    return run_interruptibly(run, args)


if __name__ == "__main__":
    sys.exit(main())
