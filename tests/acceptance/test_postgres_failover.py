"""A PostgreSQL failover in the middle of a drain, against real worker, beat and console processes.

The database is a cluster of the test's own and a synchronous streaming standby of it
(``tests.postgres_server``); every process is given one URL naming both, the standby first:
``?host=STANDBY&host=PRIMARY&target_session_attrs=read-write``. Mid-drain the primary is
stopped in immediate mode (a crash, to the clients), the workers are seen turned away by the
standby that is still read-only, then the standby is promoted. The fault is proved first (the old
primary refuses connections, the standby answers ``pg_is_in_recovery() = false``), then that
the Guarantees held: the same processes carry on by themselves, every row is sent, every
outcome acknowledged before the stop is on the new primary unchanged, and a row is delivered
twice only if it was rescued (``rescues > 0``, the counted window).

With an asynchronous standby, the second test makes certain the standby lacks the primary's
last writes, and shows what is lost then and where it shows. docs/postgres-failover.md quotes
the summary lines both tests print.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import cast

import psycopg
import pytest
import redis
from sqlalchemy import Engine, create_engine, text

from notifier import metrics
from notifier.db import stats
from notifier.db.migrate import migrate
from tests.acceptance.conftest import Services, wait_for
from tests.acceptance.fault_report import report
from tests.acceptance.test_faults import _all_sent, _by_status, _pid
from tests.console_server import Console, console_env
from tests.factories import Rows
from tests.postgres_server import PostgresServer
from tests.receiver import Receiver
from tests.server_process import process_gone

pytestmark = pytest.mark.slow

ROWS = 5000
LEASE = 10


@dataclass
class Pair:
    """A primary, its standby, and the URL naming both (the standby first)."""

    primary: PostgresServer
    standby: PostgresServer
    url: str
    #: a producer's engine, through the same URL
    engine: Engine


@pytest.fixture
def make_pair(services: Services) -> Iterator[Callable[[bool], Pair]]:
    """``make_pair(synchronous)``: a primary and its standby, migrated through the URL naming
    both, which the worker and beat are given."""
    made: list[PostgresServer] = []
    engines: list[Engine] = []

    def make(synchronous: bool) -> Pair:
        try:
            primary = PostgresServer().start()
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            pytest.skip(f"cannot start a PostgreSQL cluster of the test's own: {exc}")
        made.append(primary)
        standby = primary.standby("standby", synchronous=synchronous)
        made.append(standby)
        url = (
            f"postgresql+psycopg://postgres@/notifier?host=127.0.0.1:{standby.port}"
            f"&host=127.0.0.1:{primary.port}&target_session_attrs=read-write"
        )
        migrate(url)
        services.env.update(
            NOTIFIER_DATABASE_URL=url,
            NOTIFIER_WEBHOOK_ALLOW_HTTP="true",
            NOTIFIER_WEBHOOK_ALLOWED_NETWORKS="127.0.0.0/8",
            # Short enough that a claim whose answer was cut off is rescued within the test.
            NOTIFIER_LEASE_SECONDS=str(LEASE),
        )
        engines.append(create_engine(url, pool_pre_ping=True))
        return Pair(primary, standby, url, engines[-1])

    try:
        yield make
    finally:
        services.stop()
        for engine in engines:
            engine.dispose()
        for server in reversed(made):
            server.close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


def _sent_rows(engine: Engine) -> dict[int, datetime]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id, sent_at FROM notifications WHERE status = 'sent'"))
        return {i: at for i, at in rows.all()}


def _connected(server: PostgresServer, application_name: str) -> bool:
    found = server.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", application_name
    )
    return bool(found[0][0])


@pytest.mark.timeout(300)
def test_failover_to_a_synchronous_standby_during_drain(
    receiver: Receiver,
    services: Services,
    make_pair: Callable[[bool], Pair],
    tmp_path: Path,
) -> None:
    pair = make_pair(True)
    primary, standby, url, engine = pair.primary, pair.standby, pair.url, pair.engine
    console = Console(console_env(url), tmp_path / "console.log").start()
    try:
        ids = Rows(engine).many(
            ROWS, channel="webhook", recipient=receiver.url, subject=lambda i: f"n{i}"
        )
        services.worker("w1", concurrency=2)
        beat = services.beat()
        wait_for(lambda: len(services.children("w1")) == 2, 30, "two pool processes")
        worker, pool = services.pid("w1"), services.children("w1")
        browser = console.client()
        browser.login("alice")
        assert browser.request("GET", "/live.json").status_code == 200
        # Before the fault, the standby listed first is skipped: it cannot take writes.
        wait_for(lambda: _connected(primary, "notifier-heartbeat"), 30, "the heartbeats")
        assert not _connected(standby, "notifier-heartbeat")

        probe = psycopg.connect(
            f"host=127.0.0.1 port={primary.port} user=postgres", autocommit=True
        )
        try:
            wait_for(lambda: _by_status(engine).get("sent", 0) >= 500, 60, "the drain under way")
            acknowledged = _sent_rows(engine)
            before = _by_status(engine)
            primary.stop()  # immediate: every backend gone at once, nothing flushed further
            stopped_at, stopped = time.time(), time.monotonic()
            # The fault happened: the primary's sessions are gone, and it takes no new one.
            with pytest.raises(psycopg.OperationalError):
                probe.execute("SELECT 1")
        finally:
            probe.close()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(f"host=127.0.0.1 port={primary.port} user=postgres").close()
        assert standby.in_recovery()
        # The workers look for a primary, and the standby turns them away (read-only).
        wait_for(
            lambda: "session is read-only" in services.log("w1"),
            30,
            "a worker turned away by the standby",
        )
        turned_away = time.monotonic() - stopped
        promoting = time.monotonic()
        standby.promote()
        promote_took, no_primary = time.monotonic() - promoting, time.monotonic() - stopped
        assert not standby.in_recovery()
        (promoted_at,) = standby.execute("SELECT now()")[0]
        assert before.get("pending", 0) > 0, f"the drain was over before the failover: {before}"

        wait_for(lambda: _all_sent(engine, ROWS), 120, f"all {ROWS} rows to be sent")
        # Every process reconnected through the URL, to the new primary: the heartbeats and the
        # wake-up listener (each a connection of its own), the console's engine...
        for name in ("notifier-heartbeat", "notifier-wake"):
            wait_for(partial(_connected, standby, name), 60, f"{name} on the new primary")
        live = browser.request("GET", "/live.json")  # its gauges are read afresh each time
        assert live.status_code == 200, live.text
        assert {k: json.loads(live.text)[k] for k in ("due", "processing")} == {
            "due": 0,
            "processing": 0,
        }
        # ...and a command started afterwards (``notifier health``, a container healthcheck).
        health = subprocess.run(
            [sys.executable, "-m", "notifier.cli", "health"],
            env=services.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert health.returncode == 0, health.stdout + health.stderr
    finally:
        console.stop()

    counts = receiver.counts()
    with engine.connect() as conn:
        rescued = set(
            conn.execute(text("SELECT id FROM notifications WHERE rescues > 0")).scalars()
        )
        present = set(conn.execute(text("SELECT id FROM notifications")).scalars())
        # A write's updated_at is its transaction's start: after the stop, on the new primary.
        first_write = conn.execute(
            text("SELECT min(updated_at) FROM notifications WHERE updated_at > to_timestamp(:t)"),
            {"t": stopped_at},
        ).scalar_one()
        after: dict[str, int] = dict(
            conn.execute(
                text(
                    "SELECT claimed_by, count(*) FROM notifications"
                    " WHERE status = 'sent' AND updated_at > :t GROUP BY 1"
                ),
                {"t": promoted_at},
            ).all()
        )
    after_ack = _sent_rows(engine)
    log = services.log("w1")
    duplicates = sorted(k for k, c in counts.items() if c > 1)
    report(
        "test_failover_to_a_synchronous_standby_during_drain",
        {
            "rows": ROWS,
            "status_at_stop": before,
            "turned_away_after_seconds": round(turned_away, 1),
            "promote_seconds": round(promote_took, 1),
            "no_primary_seconds": round(no_primary, 1),
            "workers_waited_seconds": round(first_write.timestamp() - stopped_at, 1),
            "deliveries": sum(counts.values()),
            "duplicates": len(duplicates),
            "rescued_rows": len(rescued),
            "retried_writes": len(re.findall(r"database write failed", log)),
            "recorded_after_promotion_by": after,
        },
    )
    # The same processes lived through it, and carried on by themselves.
    assert not process_gone(worker)
    assert beat.poll() is None
    assert services.children("w1") == pool
    assert {_pid(claimed_by) for claimed_by in after} & set(pool)
    # Nothing written was lost: every row is on the new primary, and every outcome that was
    # acknowledged before the stop is there as it was (the standby had it before the commit
    # returned).
    assert present == set(ids)
    assert {i: after_ack.get(i) for i in acknowledged} == acknowledged
    # Every row was delivered; twice only within the counted window.
    assert set(counts) == {f"notification-{i}" for i in ids}
    assert set(duplicates) <= {f"notification-{i}" for i in rescued}, duplicates[:5]


#: The asynchronous test's rows: claimed before the standby stops, due after it stops, and
#: written after it stops (due in an hour: a reminder).
CLAIMED, DUE_LATER, WRITTEN_LATER = 20, 20, 10
#: Seconds the receiver takes to answer: sends in flight while the standby is stopped.
ANSWER_SECONDS = 4.0
#: Seconds after their INSERT that the DUE_LATER rows fall due: well after the standby stopped.
DUE_AFTER = 15


def _where(server: PostgresServer, ids: list[int]) -> dict[str, int]:
    """``status/attempts/rescues`` -> rows, of these rows on ``server``."""
    found = server.execute(
        "SELECT status || '/' || attempts || '/' || rescues, count(*) FROM notifications"
        " WHERE id = ANY(%s) GROUP BY 1",
        ids,
        database="notifier",
    )
    return {k: n for k, n in found}


@pytest.mark.timeout(300)
def test_asynchronous_standby_loses_what_it_had_not_received(
    services: Services, make_pair: Callable[[bool], Pair]
) -> None:
    """What asynchronous replication loses, made certain: the standby is stopped (it receives
    nothing more) while the primary goes on, then the primary is stopped and the standby
    promoted with what it had. Three kinds of rows show the three cases of
    docs/postgres-failover.md: an INSERT lost, a claim kept with its outcome lost, and a claim
    lost with its outcome."""
    pair = make_pair(False)
    primary, standby, engine = pair.primary, pair.standby, pair.engine
    receiver = Receiver(delay=ANSWER_SECONDS).start()
    try:
        services.worker("w1", concurrency=1)
        beat = services.beat()
        wait_for(lambda: _connected(primary, "notifier-wake"), 60, "the worker to listen")
        rows = Rows(engine)
        claimed = rows.many(CLAIMED, channel="webhook", recipient=receiver.url)
        due_later = rows.many(
            DUE_LATER,
            channel="webhook",
            recipient=receiver.url,
            next_attempt_at=datetime.now(UTC) + timedelta(seconds=DUE_AFTER),
        )
        # The claims reach the standby, then it stops while their sends are under way.
        on_both = {"processing/1/0": CLAIMED}
        wait_for(lambda: _where(standby, claimed) == on_both, 30, "the claims on the standby")
        standby.stop()
        # The fault's order held: sends still under way, the later rows not yet claimed.
        assert _where(primary, claimed) == on_both
        assert _where(primary, due_later) == {"pending/0/0": DUE_LATER}
        written_later = rows.many(
            WRITTEN_LATER,
            channel="webhook",
            recipient=receiver.url,
            next_attempt_at=datetime.now(UTC) + timedelta(hours=1),
        )
        wait_for(
            lambda: _where(primary, claimed + due_later) == {"sent/1/0": CLAIMED + DUE_LATER},
            60,
            "every due row sent, on the primary alone",
        )
        primary.stop()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(f"host=127.0.0.1 port={primary.port} user=postgres").close()
        standby.start()
        assert standby.in_recovery()
        standby.promote()
        assert not standby.in_recovery()

        # The standby had none of the last INSERTs: those rows are gone, and never sent.
        assert _where(standby, written_later) == {}
        # The rest is sent again: the claimed rows once their lease ran out (rescued), the
        # others as soon as they are due again (their claim was lost too).
        wait_for(
            lambda: (
                _where(standby, claimed) == {"sent/2/1": CLAIMED}
                and _where(standby, due_later) == {"sent/1/0": DUE_LATER}
            ),
            90,
            "every row sent again on the new primary",
        )
        twice = CLAIMED + DUE_LATER
        wait_for(lambda: sum(receiver.counts().values()) == 2 * twice, 30, "the second sends")
    finally:
        receiver.stop()

    counts = receiver.counts()
    with engine.connect() as conn:
        rescued_last_hour = stats.rescued_last_hour(conn)
        history = conn.execute(
            text(
                "SELECT count(*) FROM notification_attempts"
                " WHERE outcome = 'rescued' AND error LIKE 'lease expired:%'"
            )
        ).scalar_one()
    client = redis.Redis.from_url(services.env["NOTIFIER_REDIS_URL"])
    try:
        counted = cast("dict[bytes, bytes]", client.hgetall(metrics.ATTEMPTS_KEY))
    finally:
        client.close()
    sent_attempts = sum(int(n) for k, n in counted.items() if k.endswith(b"|sent"))
    report(
        "test_asynchronous_standby_loses_what_it_had_not_received",
        {
            "inserts_lost": WRITTEN_LATER,
            "claimed_outcome_lost": CLAIMED,
            "claim_and_outcome_lost": DUE_LATER,
            "deliveries": sum(counts.values()),
            "rescued_last_hour": rescued_last_hour,
            "sent_attempts_counted": sent_attempts,
        },
    )
    assert not process_gone(services.pid("w1"))
    assert beat.poll() is None
    # Every row the standby had was delivered twice; only the rescued ones say so in the row.
    assert set(counts.values()) == {2}
    assert set(counts) == {f"notification-{i}" for i in claimed + due_later}
    assert (rescued_last_hour, history) == (CLAIMED, CLAIMED)
    # The metrics' counters live in Redis, which the failover left alone: they counted every
    # send, the lost ones too, twice as many as the rows sent.
    assert sent_attempts == 2 * twice
