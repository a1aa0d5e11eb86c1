"""Faults made to happen for real, against real worker and beat processes.

Each test first proves its fault happened (the process is gone, rows were in flight, the
database's start time moved, the hanging server holds the connection), then that the Guarantees
in docs/guarantees.md held: nothing lost, and a second send only in the counted crash window.

Deliveries go to a real HTTP receiver on loopback that records every request's ``webhook-id``
as it arrives (and, for the SIGKILL test's email twin, to a real SMTP server that keeps every
message's ``Message-ID``). Each test prints one summary line; with ``NOTIFIER_FAULT_REPORT``
set, the numbers are also merged into that JSON file under the test's name.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, text

from notifier.db.migrate import migrate
from tests.acceptance.conftest import Services, wait_for
from tests.acceptance.fault_report import report
from tests.factories import Rows
from tests.postgres_server import PostgresServer
from tests.server_process import process_gone
from tests.smtp_sink import SmtpSink

pytestmark = pytest.mark.slow

# --- a webhook receiver that counts ------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # every send thread of every worker may connect at once

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client killed mid-request is what these tests do on purpose: stay quiet."""


@dataclass
class Receiver:
    """A real webhook receiver on loopback, HTTP/1.1 keep-alive, answering ``200``.

    Every request is recorded as it arrives, before it is answered: a worker killed while
    waiting for the answer has still delivered. ``hold(webhook_id, nth)`` keeps the answer to
    that id's nth request back until the test sets the event it returns.
    """

    deliveries: Counter[str] = field(default_factory=Counter)
    """webhook-id -> requests received."""
    held: dict[tuple[str, int], float] = field(default_factory=dict)
    """(webhook-id, nth) -> seconds that request waited for its answer."""
    _holds: dict[tuple[str, int], threading.Event] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: _Server | None = None

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two writes; without this, the body waits for a
            # delayed ACK (40 ms) on every keep-alive request.
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver._arrived(self.headers.get("webhook-id", "?"))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = _Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def _arrived(self, webhook_id: str) -> None:
        with self._lock:
            self.deliveries[webhook_id] += 1
            key = (webhook_id, self.deliveries[webhook_id])
            hold = self._holds.get(key)
        if hold is not None:
            started = time.monotonic()
            hold.wait(timeout=120)
            self.held[key] = time.monotonic() - started

    def hold(self, webhook_id: str, nth: int) -> threading.Event:
        with self._lock:
            return self._holds.setdefault((webhook_id, nth), threading.Event())

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def counts(self) -> Counter[str]:
        with self._lock:
            return Counter(self.deliveries)

    def stop(self) -> None:
        with self._lock:
            for hold in self._holds.values():
                hold.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


class HangingServer:
    """Accepts TCP connections and never says a word; holds them until stopped."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self._listener.settimeout(0.1)
        self.accepted: list[float] = []
        """time.monotonic() of every connection accepted."""
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}/hook"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            self._held.append(conn)
            self.accepted.append(time.monotonic())

    def open_connections(self) -> int:
        """Accepted connections the client has not closed yet (what it sent is read and dropped)."""
        alive = 0
        for conn in list(self._held):
            conn.setblocking(False)
            try:
                while conn.recv(65536):
                    pass
            except BlockingIOError:  # nothing more to read, and no end of file: still open
                alive += 1
            except OSError:  # reset by the client
                pass
        return alive

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._listener.close()
        for conn in self._held:
            conn.close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


@pytest.fixture
def webhook_services(services: Services) -> Services:
    """``services`` whose workers may POST to plain-http loopback receivers."""
    services.env.update(
        NOTIFIER_WEBHOOK_ALLOW_HTTP="true",
        # for the SSRF guard: loopback is blocked unless allow-listed
        NOTIFIER_WEBHOOK_ALLOWED_NETWORKS="127.0.0.0/8",
    )
    return services


# --- helpers -----------------------------------------------------------------------------------


def _webhooks(engine: Engine, url: str, n: int, **columns: object) -> list[int]:
    """``n`` webhook rows to ``url``, subjects n1, n2, ...: the work every fault interrupts."""
    return Rows(engine).many(
        n, channel="webhook", recipient=url, subject=lambda i: f"n{i}", **columns
    )


def _by_status(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT status, count(*) FROM notifications GROUP BY 1")).all()
    return {status: n for status, n in rows}


def _all_sent(engine: Engine, n: int) -> bool:
    return _by_status(engine) == {"sent": n}


def _pid(claimed_by: str) -> int:
    """``claimed_by`` is ``hostname:pid:nonce``."""
    return int(claimed_by.split(":")[1])


def _client_ports(pid: int, server_port: int, besides: int | None = None) -> set[int]:
    """The local TCP ports of ``pid``'s connections to ``server_port`` (the database's), from
    /proc: the process's socket inodes matched against the kernel's TCP tables. With
    ``besides``, only those that process does not hold too (a pool process's own connections,
    not those it inherited from its parent).

    Only connections to that port: a local port is unique to a connection, not to a host, and
    the port of the process's connection to Redis may be another process's, or this test's own,
    port to the database."""
    inodes = _socket_inodes(pid) - (_socket_inodes(besides) if besides is not None else set())
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if fields[9] in inodes and int(fields[2].rsplit(":", 1)[1], 16) == server_port:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    fds = Path(f"/proc/{pid}/fd")
    for fd in fds.iterdir() if fds.exists() else ():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def _backends(engine: Engine, ports: set[int]) -> set[int]:
    """The PostgreSQL backends serving the connections from these client ports."""
    return _stat_activity(engine, "client_port", ports)


def _busy_backends(engine: Engine, pids: set[int]) -> set[int]:
    """Those of these backends still running a statement or a transaction (not idle: a
    connection the pool process inherited from its parent may stay, idle)."""
    return _stat_activity(engine, "pid", pids, " AND state <> 'idle'")


def _stat_activity(engine: Engine, column: str, values: set[int], where: str = "") -> set[int]:
    if not values:
        return set()
    with engine.connect() as conn:
        return set(
            conn.execute(
                text(
                    f"SELECT pid FROM pg_stat_activity WHERE {column} = ANY(:values)"
                    f" AND pid <> pg_backend_pid(){where}"
                ),
                {"values": sorted(values)},
            ).scalars()
        )


def _stale(log: str) -> list[int]:
    """The ``stale=N`` of every batch summary line in a worker's log."""
    return [int(n) for n in re.findall(r"batch claimed=\d+ .*\bstale=(\d+)", log)]


# --- the faults --------------------------------------------------------------------------------

KILLS = 5
ROWS = 20_000
LEASE = 3


def _emails(engine: Engine, n: int) -> list[int]:
    """``n`` email rows to the test's SMTP sink, subjects n1, n2, ..."""
    return Rows(engine).many(
        n, channel="email", recipient="ada@example.com", subject=lambda i: f"n{i}"
    )


def _emails_received(sink: SmtpSink) -> Counter[str]:
    """``notification-{id}`` -> messages the sink accepted for that row (its Message-ID)."""
    with sink._lock:
        ids = [m.message_id for m in sink.messages]
    return Counter(_MESSAGE_ID.sub(r"\1", message_id) for message_id in ids)


_MESSAGE_ID = re.compile(r"<(notification-\d+)@[^>]*>")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("channel", ["webhook", "email"])
def test_sigkill_mid_batch_loses_nothing(
    channel: str,
    receiver: Receiver,
    smtp_sink: SmtpSink,
    engine: Engine,
    webhook_services: Services,
) -> None:
    """Webhooks, and emails (on the event loop, over the SMTP pool), to receivers that count."""
    services = webhook_services
    services.env.update(NOTIFIER_LEASE_SECONDS=str(LEASE))
    webhooks = channel == "webhook"
    ids = _webhooks(engine, receiver.url, ROWS) if webhooks else _emails(engine, ROWS)
    started = time.monotonic()
    services.worker("w1", concurrency=2)
    services.beat()
    wait_for(lambda: len(services.children("w1")) == 2, 30, "two pool processes")

    kills: list[dict[str, Any]] = []
    in_flight_ids: set[int] = set()
    killed: set[int] = set()
    missed = 0
    deadline = time.monotonic() + 150
    while len(kills) < KILLS:
        assert time.monotonic() < deadline, f"only {len(kills)} kills mid-batch: {kills}"
        with engine.connect() as conn:
            holders = conn.execute(
                text(
                    "SELECT claimed_by, count(*) FROM notifications WHERE status = 'processing'"
                    " GROUP BY 1 ORDER BY 2 DESC"
                )
            ).all()
            pending = conn.execute(
                text("SELECT count(*) FROM notifications WHERE status = 'pending'")
            ).scalar_one()
        assert pending or holders, f"the backlog drained after only {len(kills)} kills"
        pool = set(services.children("w1"))
        victim = next(
            ((cb, n) for cb, n in holders if _pid(cb) in pool and _pid(cb) not in killed), None
        )
        if victim is None:
            time.sleep(0.01)
            continue
        claimed_by, seen_holding = victim
        pid = _pid(claimed_by)
        port = engine.url.port or 5432
        backends = _backends(engine, _client_ports(pid, port))
        assert backends, f"no database connection of pool process {pid} found"
        own = _backends(engine, _client_ports(pid, port, besides=services.pid("w1")))
        os.kill(pid, signal.SIGKILL)
        killed.add(pid)
        wait_for(lambda: process_gone(pid), 5, f"pool process {pid} to die")  # noqa: B023
        # Its backends finish what it had already sent them (a COMMIT in flight still commits)
        # before they notice it is gone, and end or go idle: only then does the table show what
        # it left undone.
        wait_for(
            lambda: not _busy_backends(engine, backends),  # noqa: B023
            30,
            f"the database connections of pool process {pid} to end",
        )
        # Its own connections' backends end once they have read all it sent: one idle in the
        # check above may not yet have read a statement sent just before the kill, which would
        # then record outcomes after the rows below are read.
        wait_for(
            lambda: not _stat_activity(engine, "pid", own),  # noqa: B023
            30,
            f"the backends of pool process {pid}'s own connections to exit",
        )
        # It is dead: the rows it still holds are exactly those in flight when it died.
        with engine.connect() as conn:
            held = set(
                conn.execute(
                    text(
                        "SELECT id FROM notifications"
                        " WHERE status = 'processing' AND claimed_by = :cb"
                    ),
                    {"cb": claimed_by},
                ).scalars()
            )
        if not held:  # it recorded its batch just before the signal landed: not mid-batch
            missed += 1
            continue
        in_flight_ids |= held
        kills.append({"pid": pid, "in_flight": len(held), "seen_holding": seen_holding})
        time.sleep(1)  # spread the kills over the drain

    wait_for(lambda: _all_sent(engine, ROWS), 150, f"all {ROWS} rows to be sent")
    took = time.monotonic() - started

    counts = receiver.counts() if webhooks else _emails_received(smtp_sink)
    with engine.connect() as conn:
        rescued: dict[int, int] = dict(
            conn.execute(text("SELECT id, rescues FROM notifications WHERE rescues > 0")).all()
        )
    duplicated = {int(k.removeprefix("notification-")): c for k, c in counts.items() if c > 1}
    duplicates = sum(c - 1 for c in duplicated.values())
    in_flight = [k["in_flight"] for k in kills]
    stale = _stale(services.log("w1"))
    report(
        "test_sigkill_mid_batch_loses_nothing" + ("" if webhooks else "_email"),
        {
            "rows": ROWS,
            "deliveries": sum(counts.values()),
            "rows_delivered": len(counts),
            "duplicates": duplicates,
            "duplicated_rows": len(duplicated),
            "in_flight_at_kills": in_flight,
            "in_flight_total": sum(in_flight),
            "rescued_rows": len(rescued),
            "kills_not_mid_batch": missed,
            "stale_outcomes": sum(stale),
            "seconds": round(took, 1),
        },
    )

    # The worker lived on: Celery replaced each killed pool process.
    assert not process_gone(services.pid("w1"))
    wait_for(lambda: len(services.children("w1")) == 2, 30, "a full pool again")
    assert not killed & set(services.children("w1"))
    assert set(counts) == {f"notification-{i}" for i in ids}  # every row reached the receiver
    assert duplicates <= sum(in_flight)
    unexplained = sorted(i for i in duplicated if rescued.get(i, 0) < 1)
    assert not unexplained, f"sent twice yet never rescued: {unexplained[:5]}"
    unrescued = sorted(in_flight_ids - set(rescued))
    assert not unrescued, f"in flight at a kill yet never rescued: {unrescued[:5]}"


@pytest.mark.timeout(120)
def test_slow_worker_loses_its_lease(
    receiver: Receiver, engine: Engine, webhook_services: Services
) -> None:
    services = webhook_services
    # Long enough for the second claim to be recorded before its own lease runs out.
    lease = 3
    services.env.update(
        NOTIFIER_LEASE_SECONDS=str(lease),
        NOTIFIER_WEBHOOK_TIMEOUT="60",  # a held request must outlast the lease, not time out
    )
    [row] = _webhooks(engine, receiver.url, 1)
    webhook_id = f"notification-{row}"
    # Both requests for the row wait for their answers until the test lets them go.
    first_answer, second_answer = receiver.hold(webhook_id, 1), receiver.hold(webhook_id, 2)
    services.worker("w1", concurrency=1)
    services.worker("w2", concurrency=1)
    services.beat()

    def row_now() -> dict[str, Any]:
        with engine.connect() as conn:
            return dict(
                conn.execute(
                    text(
                        "SELECT status, attempts, rescues, claimed_by, claim_token::text AS token,"
                        " last_error FROM notifications WHERE id = :id"
                    ),
                    {"id": row},
                )
                .one()
                ._mapping
            )

    wait_for(lambda: receiver.counts()[webhook_id] == 1, 30, "the first delivery")
    first = row_now()
    assert (first["status"], first["attempts"], first["rescues"]) == ("processing", 1, 0)
    in_w1 = _pid(first["claimed_by"]) in services.children("w1")
    slow, fast = ("w1", "w2") if in_w1 else ("w2", "w1")
    assert _pid(first["claimed_by"]) in services.children(slow)

    # The first send is still waiting for its answer when the lease runs out: the row is rescued
    # and the other worker claims and delivers it again.
    wait_for(lambda: receiver.counts()[webhook_id] == 2, 30, "the delivery after the rescue")
    second = row_now()
    assert (second["status"], second["attempts"], second["rescues"]) == ("processing", 2, 1)
    assert _pid(second["claimed_by"]) in services.children(fast)
    assert second["token"] != first["token"]

    # Now the slow worker gets its answer and records it, against the other worker's claim.
    first_answer.set()
    wait_for(lambda: _stale(services.log(slow)) != [], 30, "the slow worker to record")
    assert row_now() == second  # its write changed nothing
    second_answer.set()
    wait_for(lambda: row_now()["status"] == "sent", 30, "the row to be sent")

    final = row_now()
    report(
        "test_slow_worker_loses_its_lease",
        {
            "lease_seconds": lease,
            "first_request_held_seconds": round(receiver.held[(webhook_id, 1)], 1),
            "deliveries": receiver.counts()[webhook_id],
            "slow_worker_stale": _stale(services.log(slow)),
            "other_worker_stale": _stale(services.log(fast)),
        },
    )
    assert receiver.held[(webhook_id, 1)] > lease  # the provider call was slower than the lease
    assert _stale(services.log(slow)) == [1]
    assert _stale(services.log(fast)) == [0]
    # Sent under the second claim, which the row keeps; the rescue says whose lease expired.
    assert final["status"] == "sent"
    assert (final["attempts"], final["rescues"]) == (2, 1)
    assert (final["claimed_by"], final["token"]) == (second["claimed_by"], second["token"])
    assert final["last_error"] is None  # a sent row: the history keeps why it was rescued
    with engine.connect() as conn:
        (rescue,) = conn.execute(
            text(
                "SELECT error FROM notification_attempts"
                " WHERE notification_id = :id AND outcome = 'rescued'"
            ),
            {"id": row},
        ).scalars()
    assert rescue.startswith(f"lease expired: worker {first['claimed_by']} ")
    # The one counted duplicate: two deliveries, visible as rescues = 1.
    assert receiver.counts() == Counter({webhook_id: 2})


@pytest.fixture
def own_postgres(services: Services) -> Iterator[tuple[PostgresServer, str, Engine]]:
    """A PostgreSQL cluster of this test's own, migrated, that the worker and beat use: the
    test restarts it, never the machine's server other test runs depend on."""
    try:
        server = PostgresServer().start()
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot start a PostgreSQL cluster of the test's own: {exc}")
    try:
        url = f"{server.url}/notifier"
        migrate(url)
        services.env.update(NOTIFIER_DATABASE_URL=url)
        eng = create_engine(url, pool_pre_ping=True)
        yield server, url, eng
        eng.dispose()
    finally:
        services.stop()
        server.close()


@pytest.mark.timeout(180)
def test_postgres_restart_during_drain(
    receiver: Receiver,
    webhook_services: Services,
    own_postgres: tuple[PostgresServer, str, Engine],
) -> None:
    server, database_url, engine = own_postgres
    services = webhook_services
    rows = 5000
    # Short enough that a claim whose commit was cut off is rescued within the test.
    services.env.update(NOTIFIER_LEASE_SECONDS="10")
    ids = _webhooks(engine, receiver.url, rows)
    services.worker("w1", concurrency=2)
    services.beat()
    wait_for(lambda: len(services.children("w1")) == 2, 30, "two pool processes")
    worker, pool = services.pid("w1"), services.children("w1")

    probe = psycopg.connect(
        database_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True
    )
    try:
        probe_row = probe.execute("SELECT pg_backend_pid(), pg_postmaster_start_time()").fetchone()
        assert probe_row is not None
        _, started_before = probe_row
        wait_for(lambda: _by_status(engine).get("sent", 0) >= 500, 60, "the drain to be under way")
        before = _by_status(engine)
        restarted_at = time.monotonic()
        server.restart()
        restart_took = time.monotonic() - restarted_at
        # The fault happened: the probe's backend is gone and the server started again.
        with pytest.raises(psycopg.OperationalError):
            probe.execute("SELECT 1")
    finally:
        probe.close()
    with engine.connect() as conn:  # pool_pre_ping replaces the engine's dead connection
        # The server's start is the reference for "sent after the restart": the test reads it
        # once reconnected, but it is fixed by then however long reconnecting took, and rows
        # were still pending at the restart, so some can only be claimed after it.
        started_after = conn.execute(text("SELECT pg_postmaster_start_time()")).scalar_one()
    assert started_after > started_before
    assert before.get("pending", 0) > 0, f"the drain was over before the restart: {before}"

    wait_for(lambda: _all_sent(engine, rows), 120, f"all {rows} rows to be sent")

    counts = receiver.counts()
    with engine.connect() as conn:
        rescued = conn.execute(
            text("SELECT count(*) FROM notifications WHERE rescues > 0")
        ).scalar_one()
        after_restart: dict[str, int] = dict(
            conn.execute(
                text(
                    "SELECT claimed_by, count(*) FROM notifications WHERE sent_at > :t GROUP BY 1"
                ),
                {"t": started_after},
            ).all()
        )
    log = services.log("w1")
    report(
        "test_postgres_restart_during_drain",
        {
            "rows": rows,
            "status_at_restart": before,
            "restart_seconds": round(restart_took, 1),
            "deliveries": sum(counts.values()),
            "duplicates": sum(counts.values()) - len(counts),
            "rescued_rows": rescued,
            "sent_after_restart_by": after_restart,
        },
    )
    # The worker saw the database go away...
    assert re.search(r"AdminShutdown|OperationalError|shutting down|Connection refused", log)
    # ...and lived through it: the same processes, still consuming afterwards.
    assert not process_gone(worker)
    assert services.children("w1") == pool
    assert {_pid(cb) for cb in after_restart} & set(pool)
    # Nothing lost, nothing sent twice.
    assert set(counts) == {f"notification-{i}" for i in ids}
    repeated = sorted(k for k, c in counts.items() if c > 1)
    assert not repeated, f"{len(repeated)} rows sent twice, e.g. {repeated[:5]}"


@pytest.mark.timeout(120)
def test_hanging_provider_times_out_and_frees_the_slot(
    receiver: Receiver, engine: Engine, webhook_services: Services
) -> None:
    services = webhook_services
    timeout, lease = 2, 300
    services.env.update(NOTIFIER_WEBHOOK_TIMEOUT=str(timeout), NOTIFIER_LEASE_SECONDS=str(lease))
    hang = HangingServer()
    try:
        [stuck] = _webhooks(engine, hang.url, 1, max_attempts=3)
        services.worker("w1", concurrency=1)  # one slot: a hang that held it would stop all
        services.beat()
        wait_for(lambda: len(services.children("w1")) == 1, 30, "the pool process")
        worker, pool = services.pid("w1"), services.children("w1")

        def row_now() -> tuple[str, int, str]:
            """status, attempts, last_error"""
            with engine.connect() as conn:
                status, attempts, error = conn.execute(
                    text("SELECT status, attempts, last_error FROM notifications WHERE id = :id"),
                    {"id": stuck},
                ).one()
            return status, attempts, error

        # The hang happened: the server holds the connection of a send that is under way.
        wait_for(lambda: len(hang.accepted) == 1, 30, "the send to connect")
        assert row_now()[:2] == ("processing", 1)
        assert hang.open_connections() == 1
        # Remember when the claim was made: a retry clears locked_until.
        with engine.connect() as conn:
            claimed_at = conn.execute(
                text(
                    "SELECT locked_until - make_interval(secs => :lease) FROM notifications"
                    " WHERE id = :id"
                ),
                {"id": stuck, "lease": lease},
            ).scalar_one()

        wait_for(lambda: row_now()[0] == "pending", timeout + 10, "the send to time out")
        with engine.connect() as conn:
            status, attempts, error, took = conn.execute(
                text(
                    "SELECT status, attempts, last_error,"
                    " extract(epoch FROM updated_at - :claimed)::float8"
                    " FROM notifications WHERE id = :id"
                ),
                {"id": stuck, "claimed": claimed_at},
            ).one()
        assert (status, attempts) == ("pending", 1)
        assert "timed out" in error
        assert f"{timeout}s limit" in error
        # About the configured limit: well short of three of them, or of the 10 s default.
        assert timeout * 0.95 <= took < timeout * 2.5

        # The next attempt hangs too. While it does, a good row goes out at once.
        wait_for(lambda: len(hang.accepted) == 2, 30, "the second attempt to connect")
        [good] = _webhooks(engine, receiver.url, 1)
        inserted = time.monotonic()
        wait_for(
            lambda: receiver.counts()[f"notification-{good}"] == 1, 20, "the good row's delivery"
        )
        good_latency = time.monotonic() - inserted
        assert row_now()[:2] in {("processing", 2), ("pending", 2), ("processing", 3)}

        wait_for(lambda: row_now()[0] == "dead", 30, "the hanging row to be given up")
        status, attempts, error = row_now()
        open_after = hang.open_connections()
    finally:
        hang.stop()

    log = services.log("w1")
    report(
        "test_hanging_provider_times_out_and_frees_the_slot",
        {
            "webhook_timeout": timeout,
            "first_attempt_seconds": round(took, 2),
            "connections_hung": len(hang.accepted),
            "good_row_latency_seconds": round(good_latency, 2),
        },
    )
    assert good_latency < 2 * timeout + 3  # the hanging send's timeout, then a beat tick
    assert attempts == 3
    assert len(hang.accepted) == 3  # each attempt hung, on a connection of its own
    assert error.startswith("gave up after 3 attempts; last error: timed out")
    assert open_after == 0  # and each timed-out connection was closed, not leaked
    # No Celery time limit was needed: the same processes ran throughout.
    assert "TimeLimitExceeded" not in log
    assert "Hard time limit" not in log
    assert not process_gone(worker)
    assert services.children("w1") == pool
