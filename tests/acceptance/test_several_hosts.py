"""Workers on two hosts, PostgreSQL and Redis on a third, and one worker host cut off mid-drain.

Three test hosts (``tests.testhosts``) a 1 ms round trip apart: PostgreSQL, Redis and beat on
``db``; a worker with two pool processes on each of ``w1`` and ``w2``, each host under a host name
of its own, which its workers' ``claimed_by`` carries. The webhook receiver listens on this
machine, at the end of the db host's link. Mid-drain ``w1``'s link is taken down, as when a
switch port dies: its processes keep running, and reach nothing.

The test first proves the cut happened (``w1`` can no longer open a connection to PostgreSQL,
``w2`` still can), then that the heartbeat rule of docs/guarantees.md held: ``w2`` drains the
whole backlog alone; ``w1``'s rows come back within a few beats, rescued as a worker gone (the
lease is longer than the test); nothing from ``w1`` reaches the database while it is cut off;
every row is delivered, and the only rows delivered twice are rows ``w1`` held at the cut. Then
the link comes back, and ``w1``'s same processes, never restarted, beat, claim and send again by
themselves. It prints one summary line, also merged into ``NOTIFIER_FAULT_REPORT`` if set.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text

from notifier.db.migrate import migrate
from tests.acceptance.conftest import Services, wait_for
from tests.acceptance.fault_report import report
from tests.factories import Rows
from tests.postgres_server import PostgresServer
from tests.receiver import Receiver
from tests.redis_server import RedisServer
from tests.server_process import process_gone
from tests.testhosts import Network, Unavailable

pytestmark = pytest.mark.slow

#: The whole test, setting up included (the first run on a machine may build nfqdelay).
TIMEOUT = 420
ROWS = 4000
#: Rows of each wave inserted after the link is back, until ``w1`` claims one.
WAVE = 50
HEARTBEAT_SECONDS = 1
#: Longer than the test: only the heartbeat rule can hand ``w1``'s rows back.
LEASE_SECONDS = 300
#: A receiver that takes this long to answer keeps the drain going for a while.
ANSWER_SECONDS = 0.05


@dataclass
class Backends:
    """What runs on the db host, as the workers and the test reach it."""

    postgres: PostgresServer
    redis: RedisServer
    database_url: str
    engine: Engine


@pytest.fixture
def network() -> Iterator[Network]:
    try:
        net = Network(("db", "w1", "w2"), seconds=TIMEOUT + 60).start()
    except Unavailable as exc:
        pytest.skip(f"no test hosts on this machine: {exc}")
    try:
        yield net
    finally:
        net.close()


@pytest.fixture
def backends(network: Network) -> Iterator[Backends]:
    """PostgreSQL and Redis of this test's own on the db host, migrated and reachable from every
    host's network."""
    db = network["db"]
    try:
        postgres = PostgresServer(host=db.address, inside=db.inside, clients=network.networks)
    except RuntimeError as exc:  # no PostgreSQL server package
        pytest.skip(f"cannot start a PostgreSQL cluster of the test's own: {exc}")
    # Without a password Redis takes only loopback's connections unless told otherwise.
    redis = RedisServer("--protected-mode", "no", host=db.address, inside=db.inside)
    try:
        postgres.start()
        redis.start()
        url = f"{postgres.url}/notifier"
        migrate(url, say=lambda _: None)
        engine = create_engine(url, pool_pre_ping=True)
        yield Backends(postgres, redis, url, engine)
        engine.dispose()
    finally:
        redis.close()
        postgres.close()


@pytest.fixture
def receiver(network: Network) -> Iterator[Receiver]:
    r = Receiver(delay=ANSWER_SECONDS, host=network["db"].gateway).start()
    yield r
    r.stop()


@pytest.fixture
def services(
    network: Network,
    backends: Backends,
    receiver: Receiver,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[dict[str, Services]]:
    """Celery processes on each host (``Services`` started under the host's command prefix),
    with the settings that make the test short: one beat a second, and small claims so that a
    host holds a bounded number of rows."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k.startswith("NOTIFIER_") or k in ("PATH", "HOME", "LANG", "PYTHONPATH", "VIRTUAL_ENV")
    }
    env.update(
        NOTIFIER_DATABASE_URL=backends.database_url,
        NOTIFIER_REDIS_URL=backends.redis.url,
        NOTIFIER_DISPATCH_INTERVAL="1",
        NOTIFIER_RETRY_BASE_SECONDS="1",
        NOTIFIER_RETRY_MAX_SECONDS="8",
        NOTIFIER_HEARTBEAT_SECONDS=str(HEARTBEAT_SECONDS),
        NOTIFIER_LEASE_SECONDS=str(LEASE_SECONDS),
        NOTIFIER_BATCH_SIZE="50",
        NOTIFIER_MAX_BATCH_SIZE="100",
        NOTIFIER_ASYNC_SEND_CONCURRENCY="5",
        NOTIFIER_WEBHOOK_TIMEOUT="3",
        NOTIFIER_WEBHOOK_ALLOW_HTTP="true",
        NOTIFIER_WEBHOOK_ALLOWED_NETWORKS=f"{network['db'].gateway}/32",
        NOTIFIER_EXPECTED_WORKERS="2",
        PYTHONUNBUFFERED="1",
    )
    made = {}
    for role, host in network.hosts.items():
        logs = tmp_path / role
        logs.mkdir()
        made[role] = Services(
            dict(env), logs, celery=(*host.machine, sys.executable, "-m", "celery")
        )
    failed_before = request.session.testsfailed
    yield made
    for svc in made.values():
        svc.stop()
    if request.session.testsfailed > failed_before:
        for role, svc in made.items():
            print(f"=== {role} ===\n{svc.output()}")


# --- what the database says ------------------------------------------------------------------


def _one(engine: Engine, sql: str, **params: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar_one()


def _ids(engine: Engine, sql: str, **params: Any) -> set[int]:
    with engine.connect() as conn:
        return set(conn.execute(text(sql), params).scalars())


#: The host part of ``claimed_by`` (``hostname:pid:nonce``), and of a worker's name.
HOST_OF = "split_part({}, ':', 1)"


def _held_by(engine: Engine, host: str) -> set[int]:
    """Rows ``host``'s workers hold: claimed, outcome not recorded."""
    return _ids(
        engine,
        "SELECT id FROM notifications WHERE status = 'processing'"
        f" AND {HOST_OF.format('claimed_by')} = :host",
        host=host,
    )


def _claimed_by_hosts(engine: Engine, ids: list[int] | None = None) -> dict[str, int]:
    """Host -> rows it claimed last (of ``ids``, or of all)."""
    where = "" if ids is None else " AND id = ANY(:ids)"
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                f"SELECT {HOST_OF.format('claimed_by')}, count(*) FROM notifications"
                f" WHERE claimed_by IS NOT NULL{where} GROUP BY 1"
            ),
            {"ids": ids},
        ).all()
    return {host: n for host, n in rows}


def _sent(engine: Engine, ids: list[int]) -> int:
    return int(
        _one(
            engine,
            "SELECT count(*) FROM notifications WHERE status = 'sent' AND id = ANY(:ids)",
            ids=ids,
        )
    )


def _beats_since(engine: Engine, host: str, since: datetime) -> int:
    """Heartbeats of ``host``'s worker processes that reached the database after ``since``."""
    return int(
        _one(
            engine,
            f"SELECT count(*) FROM workers WHERE {HOST_OF.format('name')} = :host"
            " AND last_seen >= :since",
            host=host,
            since=since,
        )
    )


def _stale(log: str) -> list[int]:
    """The ``stale=N`` of every batch summary line in a worker's log: outcomes it recorded
    for rows no longer its own, which changed nothing."""
    return [int(n) for n in re.findall(r"batch claimed=\d+ .*\bstale=(\d+)", log)]


def _webhooks(engine: Engine, url: str, n: int, prefix: str) -> list[int]:
    return Rows(engine).many(n, channel="webhook", recipient=url, subject=lambda i: f"{prefix}{i}")


# --- the test ----------------------------------------------------------------------------------


@pytest.mark.timeout(TIMEOUT)
def test_worker_host_cut_off_mid_drain(
    network: Network, backends: Backends, receiver: Receiver, services: dict[str, Services]
) -> None:
    db, w1, w2 = network["db"], network["w1"], network["w2"]
    engine, port = backends.engine, backends.postgres.port
    round_trip = w1.round_trip_ms(db.address, port)
    ids = _webhooks(engine, receiver.url, ROWS, "n")
    for role in ("w1", "w2"):
        services[role].worker("worker", concurrency=2)
    services["db"].beat()
    for role in ("w1", "w2"):
        wait_for(
            lambda: len(services[role].children("worker")) == 2,  # noqa: B023
            60,
            f"the two pool processes on {role}",
        )
    mains = {role: services[role].pid("worker") for role in ("w1", "w2")}
    pools = {role: services[role].children("worker") for role in ("w1", "w2")}
    wait_for(
        lambda: _claimed_by_hosts(engine).keys() >= {w1.name, w2.name}, 60, "both hosts to claim"
    )
    assert w1.reaches(db.address, port)  # before the cut, w1 reaches PostgreSQL
    wait_for(lambda: _sent(engine, ids) >= ROWS // 10, 60, "the drain to be under way")
    wait_for(lambda: len(_held_by(engine, w1.name)) > 0, 30, "w1 to hold rows")

    # --- the cut
    network.cut(w1)
    cut_clock = time.monotonic()
    with engine.connect() as conn:  # now() is the transaction's start: just after the cut
        cut_at = conn.execute(text("SELECT now()")).scalar_one()
    held = _held_by(engine, w1.name)
    pending_at_cut = _ids(engine, "SELECT id FROM notifications WHERE status = 'pending'")
    # The fault happened: w1 can no longer open a connection to PostgreSQL; w2 still can.
    assert not w1.reaches(db.address, port, timeout=2), "w1 still reaches PostgreSQL"
    assert w2.reaches(db.address, port)
    assert held, "w1 held no rows at the cut: not mid-drain"
    assert pending_at_cut, "the backlog was drained before the cut"

    wait_for(lambda: not _held_by(engine, w1.name), 60, "w1's rows to be rescued")
    rescue_seconds = time.monotonic() - cut_clock
    wait_for(lambda: _sent(engine, ids) == ROWS, 120, f"w2 to send all {ROWS} rows alone")
    drained_seconds = time.monotonic() - cut_clock

    # While w1 is cut off, nothing of it reaches the database: no heartbeat, no attempt, no
    # claim. Every row claimed since the cut (those pending then, and those rescued) is w2's.
    rescued = _ids(engine, "SELECT id FROM notifications WHERE rescues > 0")
    with engine.connect() as conn:
        rescues = conn.execute(
            text(
                "SELECT notification_id, error, extract(epoch FROM at - :cut)::float8"
                " FROM notification_attempts WHERE outcome = 'rescued'"
            ),
            {"cut": cut_at},
        ).all()
        attempts_by_w1 = conn.execute(
            text(
                "SELECT count(*) FROM notification_attempts"
                f" WHERE {HOST_OF.format('worker')} = :host AND at >= :cut"
                " AND outcome <> 'rescued'"  # the rescue writes those, in the gone worker's name
            ),
            {"host": w1.name, "cut": cut_at},
        ).scalar_one()
    assert _beats_since(engine, w1.name, cut_at) == 0
    assert attempts_by_w1 == 0
    claimed_since_cut = _claimed_by_hosts(engine, sorted(pending_at_cut | rescued))
    assert claimed_since_cut.keys() == {w2.name}, claimed_since_cut
    # w1's rows, and only those, came back by the heartbeat rule (not by their lease).
    assert rescued == held
    gone = re.compile(rf"worker gone: {w1.name}:\d+:\w+ sent no heartbeat for (\d+)s")
    silences = [gone.match(error or "") for _, error, _ in rescues]
    assert all(silences), [error for _, error, _ in rescues][:3]
    silent_seconds = max(int(m.group(1)) for m in silences if m)

    # --- the link comes back: w1's same processes beat, claim and send again by themselves
    network.restore(w1)
    restore_clock = time.monotonic()
    with engine.connect() as conn:
        restored_at = conn.execute(text("SELECT now()")).scalar_one()
    wait_for(lambda: w1.reaches(db.address, port, timeout=1), 30, "w1 to reach PostgreSQL again")
    wait_for(lambda: _beats_since(engine, w1.name, restored_at) > 0, 120, "w1's heartbeat")
    beating_seconds = time.monotonic() - restore_clock
    second: list[int] = []
    while w1.name not in _claimed_by_hosts(engine, second):
        assert time.monotonic() - restore_clock < 180, f"w1 claimed none of {len(second)} rows"
        wave = _webhooks(engine, receiver.url, WAVE, f"r{len(second)}-")
        second += wave
        wait_for(lambda: _sent(engine, wave) == WAVE, 60, "a wave to be sent")  # noqa: B023
    claiming_seconds = time.monotonic() - restore_clock
    wait_for(lambda: _sent(engine, second) == len(second), 60, "the rows after the cut")
    # What w1 had under way at the cut it recorded once back, against rows rescued and sent
    # since: each such write found another claim and changed nothing.
    wait_for(lambda: sum(_stale(services["w1"].log("worker"))) > 0, 60, "w1's late outcomes")
    assert _sent(engine, ids) == ROWS

    counts = receiver.arrivals()
    duplicated = {int(k.removeprefix("notification-")): c for k, c in counts.items() if c > 1}
    report(
        "test_worker_host_cut_off_mid_drain",
        {
            "rows": ROWS,
            "round_trip_ms": round(round_trip, 2),
            "held_at_cut": len(held),
            "pending_at_cut": len(pending_at_cut),
            "rescued_rows": len(rescued),
            "rescue_seconds": round(rescue_seconds, 1),
            "rescued_after_cut_seconds": round(max(s for _, _, s in rescues), 1),
            "silent_seconds": silent_seconds,
            "drained_alone_seconds": round(drained_seconds, 1),
            "deliveries": sum(counts.values()),
            "duplicates": sum(c - 1 for c in duplicated.values()),
            "duplicated_rows": len(duplicated),
            "beating_again_seconds": round(beating_seconds, 1),
            "claiming_again_seconds": round(claiming_seconds, 1),
            "rows_after_restore": len(second),
            "claimed_after_restore_by": _claimed_by_hosts(engine, second),
            "late_outcomes_ignored": sum(_stale(services["w1"].log("worker"))),
        },
    )
    # The same processes throughout: none restarted, none replaced.
    for role in ("w1", "w2"):
        assert not process_gone(mains[role])
        assert services[role].children("worker") == pools[role]
    # Nothing lost; a second delivery only of a row w1 held when it was cut off.
    assert set(counts) == {f"notification-{i}" for i in ids + second}
    assert set(duplicated) <= held, sorted(set(duplicated) - held)[:5]
