"""Workers and producers behind a real PgBouncer in transaction mode (docs/pgbouncer.md).

Each test starts a PgBouncer of its own (``tests.pgbouncer_server``) in front of the test's own
database, with a pool smaller than the clients the workers open, and real ``celery worker`` and
``beat`` processes. The faults come first: with prepared statements left on, the workers' own
statements fail behind the pooler; a LISTEN through the pooler hears nothing. Then the setup of
docs/pgbouncer.md drains a backlog exactly once, through the pooler (its admin console shows
the clients sharing fewer server connections), and still wakes on an insert; and the start-time
budget is checked against PgBouncer's ``max_client_conn``.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

import notifier
from notifier import db
from tests.acceptance.conftest import Services, unfinished, wait_for
from tests.conftest import POSTGRES
from tests.factories import SetEnv
from tests.pgbouncer_server import PgBouncer, binary
from tests.receiver import Receiver

pytestmark = pytest.mark.skipif(
    binary() is None, reason="PgBouncer is not installed (apt-get install pgbouncer)"
)

#: Server connections PgBouncer keeps for the test's database: fewer than the workers' clients.
POOL_SIZE = 3
#: The backlog the workers drain.
ROWS = 3000
#: What beat's dispatch interval is in these tests: a wake-up must come well before it.
BEAT_SECONDS = 30


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


def _pgbouncer(max_client_conn: int = 200) -> PgBouncer:
    upstream = make_url(POSTGRES)
    return PgBouncer(
        upstream.port or 5432,
        upstream_host=upstream.host or "127.0.0.1",
        pool_size=POOL_SIZE,
        max_client_conn=max_client_conn,
    ).start()


@pytest.fixture
def pgbouncer() -> Iterator[PgBouncer]:
    server = _pgbouncer()
    yield server
    server.close()


@pytest.fixture
def producer(pgbouncer: PgBouncer, database_url: str, set_env: SetEnv) -> Iterator[Engine]:
    """A producer's engine through PgBouncer, set up as docs/pgbouncer.md says: no prepared
    statements. Its checks allow the plain-http loopback receiver, as the workers' do."""
    set_env(webhook_allow_http=True, webhook_allowed_networks="127.0.0.0/8")
    name = make_url(database_url).database or ""
    engine = db.make_engine(pgbouncer.url(name), pooled=True)
    yield engine
    engine.dispose()


def _behind(services: Services, pgbouncer: PgBouncer, database_url: str, **env: str) -> None:
    """The workers' environment: the database through PgBouncer, then ``env``."""
    name = make_url(database_url).database or ""
    services.env.update(
        NOTIFIER_DATABASE_URL=pgbouncer.url(name),
        NOTIFIER_DISPATCH_INTERVAL=str(BEAT_SECONDS),
        NOTIFIER_WEBHOOK_ALLOW_HTTP="true",
        NOTIFIER_WEBHOOK_ALLOWED_NETWORKS="127.0.0.0/8",
        **env,
    )


def _enqueue(producer: Engine, url: str, n: int, first: int = 1) -> list[int]:
    """``n`` webhooks written with ``notifier.enqueue`` through PgBouncer, 250 a transaction."""
    ids: list[int] = []
    for start in range(first, first + n, 250):
        with producer.begin() as conn:
            for i in range(start, min(start + 250, first + n)):
                made = notifier.enqueue(conn, channel="webhook", to=url, payload={"n": i})
                ids.append(made.id)
    return ids


def _sent(engine: Engine, ids: list[int]) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM notifications WHERE status = 'sent' AND id = ANY(:ids)"),
                {"ids": ids},
            ).scalar_one()
        )


def _sent_all(engine: Engine, ids: list[int]) -> bool:
    return _sent(engine, ids) == len(ids)


def _allowed(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT current_setting('max_connections')::int"
                    " - current_setting('superuser_reserved_connections')::int"
                    " - coalesce(current_setting('reserved_connections', true), '0')::int"
                )
            ).scalar_one()
        )


class PoolWatch(threading.Thread):
    """Samples PgBouncer's ``SHOW POOLS`` for one database every 0.1 s: the most clients and
    the most server connections seen at once."""

    def __init__(self, pgbouncer: PgBouncer, database: str) -> None:
        super().__init__(daemon=True)
        self.pgbouncer, self.database = pgbouncer, database
        self.clients = self.servers = 0
        self.modes: set[str] = set()
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            for pool in self.pgbouncer.show("POOLS"):
                if pool["database"] == self.database:
                    self._seen(pool)
            self._done.wait(0.1)

    def _seen(self, pool: dict[str, Any]) -> None:
        clients = pool["cl_active"] + pool["cl_waiting"]
        servers = sum(pool[k] for k in ("sv_active", "sv_idle", "sv_used", "sv_tested", "sv_login"))
        self.clients = max(self.clients, clients)
        self.servers = max(self.servers, servers)
        self.modes.add(pool["pool_mode"])

    def stop(self) -> None:
        self._done.set()
        self.join()


def _beat_dispatches(services: Services) -> int:
    """Dispatches beat has sent so far."""
    return services.log("beat").count("Sending due task dispatch (notifier.dispatch)")


# --- the faults, first -------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_without_the_pooler_setting_prepared_statements_break_behind_pgbouncer(
    engine: Engine,
    database_url: str,
    services: Services,
    pgbouncer: PgBouncer,
    producer: Engine,
    receiver: Receiver,
) -> None:
    _enqueue(producer, receiver.url, ROWS)
    # The same setup as the drain below, but for NOTIFIER_DATABASE_POOLER: psycopg prepares.
    _behind(services, pgbouncer, database_url, NOTIFIER_DATABASE_SESSION_URL=database_url)
    services.worker("w1", concurrency=2)
    services.worker("w2", concurrency=2)
    services.beat()

    def broke() -> bool:
        said = services.log("w1") + services.log("w2")
        return 'prepared statement "_pg3_' in said

    # The failed statements are the fault. How many rows they hold up depends on the timing:
    # psycopg prepares a statement at its fifth run on a connection, which on a fast machine
    # comes after the backlog is sent, and a failed statement is run again.
    wait_for(broke, 90, "a prepared statement to be missing, or another client's, on the server")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_listen_through_the_transaction_pooler_hears_no_insert(
    engine: Engine,
    database_url: str,
    services: Services,
    pgbouncer: PgBouncer,
    producer: Engine,
    receiver: Receiver,
) -> None:
    name = make_url(database_url).database or ""
    _behind(
        services,
        pgbouncer,
        database_url,
        NOTIFIER_DATABASE_POOLER="transaction",
        NOTIFIER_DATABASE_SESSION_URL=pgbouncer.url(name),  # the mistake: LISTEN through it
    )
    services.worker("w1", concurrency=1)  # and no beat: only a wake-up can send the row
    wait_for(lambda: "ready" in services.log("w1"), 30, "the worker to be ready")
    wait_for(
        lambda: any(c["application_name"] == "notifier-wake" for c in pgbouncer.show("CLIENTS")),
        30,
        "the LISTEN connection, through PgBouncer",
    )
    wait_for(
        lambda: (
            "Task notifier.dispatch[" in services.log("w1") and " succeeded " in services.log("w1")
        ),
        30,
        "the dispatch every worker makes at start to find nothing",
    )
    ids = _enqueue(producer, receiver.url, 1)
    time.sleep(8)
    assert _sent(engine, ids) == 0
    assert receiver.counts() == {}


# --- behind PgBouncer as docs/pgbouncer.md sets it up --------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_workers_drain_a_backlog_through_pgbouncer_exactly_once_and_wake_on_an_insert(
    engine: Engine,
    database_url: str,
    services: Services,
    pgbouncer: PgBouncer,
    producer: Engine,
    receiver: Receiver,
) -> None:
    name = make_url(database_url).database or ""
    # Enough worker containers that PostgreSQL alone could not hold their connections: the
    # start-time budget counts PgBouncer's clients and server connections instead.
    allowed = _allowed(engine)
    replicas = allowed // (2 * 5 + 2) + 1
    assert replicas * (2 * 5 + 2) + 7 > allowed
    ids = _enqueue(producer, receiver.url, ROWS)
    _behind(
        services,
        pgbouncer,
        database_url,
        NOTIFIER_DATABASE_POOLER="transaction",
        NOTIFIER_DATABASE_SESSION_URL=database_url,
        NOTIFIER_EXPECTED_WORKERS=str(replicas),
    )
    watch = PoolWatch(pgbouncer, name)
    watch.start()
    try:
        services.worker("w1", concurrency=2)
        services.worker("w2", concurrency=2)
        services.beat()
        wait_for(lambda: unfinished(engine) == 0, 180, "the backlog to drain")
    finally:
        watch.stop()

    counts = receiver.counts()
    assert set(counts) == {f"notification-{i}" for i in ids}
    assert set(counts.values()) == {1}
    assert _sent(engine, ids) == ROWS
    said = services.log("w1") + services.log("w2")
    assert "prepared statement" not in said
    assert "notifier needs" not in said
    # Through PgBouncer, in transaction mode: more clients than server connections.
    assert watch.modes == {"transaction"}
    assert watch.servers <= POOL_SIZE < watch.clients, (watch.servers, watch.clients)

    # The LISTEN is PostgreSQL's own session (checked there, on the session URL), one per
    # worker, and no client of PgBouncer's.
    with engine.connect() as conn:
        listening = conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name = 'notifier-wake' AND query = 'LISTEN notifier_wake'"
            )
        ).scalar_one()
    assert listening == 2
    assert not [c for c in pgbouncer.show("CLIENTS") if c["application_name"] == "notifier-wake"]

    # A row written through PgBouncer goes out well before beat's next dispatch, and beat
    # sends none meanwhile: the wake-up did it. (Should beat's dispatch fall in that moment
    # after all, the row proves nothing, and another is written.)
    time.sleep(2)
    for tried in range(ROWS + 1, ROWS + 4):
        beats = _beat_dispatches(services)
        started = time.monotonic()
        woken = _enqueue(producer, receiver.url, 1, first=tried)
        wait_for(partial(_sent_all, engine, woken), BEAT_SECONDS, "the inserted row to be sent")
        took = time.monotonic() - started
        if _beat_dispatches(services) == beats:
            break
    assert _beat_dispatches(services) == beats
    assert took < 5, took
    assert receiver.counts()[f"notification-{woken[0]}"] == 1
    print(
        f"behind PgBouncer: {ROWS} rows sent once each; at most {watch.clients} clients on"
        f" {watch.servers} server connections; an insert sent {took:.2f}s after it was written"
    )


@pytest.mark.timeout(90)
def test_a_worker_that_pgbouncer_cannot_hold_refuses_to_start_naming_max_client_conn(
    engine: Engine, database_url: str, services: Services
) -> None:
    small = _pgbouncer(max_client_conn=50)
    try:
        _behind(
            services,
            small,
            database_url,
            NOTIFIER_DATABASE_POOLER="transaction",
            NOTIFIER_DATABASE_SESSION_URL=database_url,
            NOTIFIER_EXPECTED_WORKERS="10",
        )
        worker = services.worker("w1", concurrency=2)
        try:
            code = worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the worker started anyway:\n{services.log('w1')[-2000:]}")
    finally:
        small.close()
    log = services.log("w1")
    assert code != 0
    line = (
        "notifier needs 117 client connections to PgBouncer (10 worker(s) x (2 processes x 5"
        " + 1) + 7 for metrics and commands), its max_client_conn is 50: raise max_client_conn"
        " in pgbouncer.ini, or lower --concurrency or NOTIFIER_EXPECTED_WORKERS"
    )
    assert log.count(line) == 1
    assert "Traceback" not in log
