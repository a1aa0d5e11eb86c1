"""Real worker processes dying, starting on a backlog, and starting where they cannot fit.

The kill is real (SIGKILL to a worker's whole process group, as ``docker kill -s KILL`` does to
a container) and proven: every PID is gone and the worker held rows when it died.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from tests.acceptance.conftest import Services, wait_for
from tests.factories import MakeRows, ago
from tests.receiver import Receiver
from tests.server_process import process_gone

HEARTBEAT = 1.0
#: What the heartbeat lets a worker miss before it is gone (``MISSES`` beats of
#: ``notifier.worker.heartbeat``).
GRACE = 3 * HEARTBEAT
LEASE = 300


@pytest.fixture
def slow_receiver() -> Iterator[Receiver]:
    r = Receiver(delay=1.0).start()
    yield r
    r.stop()


def _pid(claimed_by: str) -> int:
    """``claimed_by`` is ``hostname:pid:nonce``."""
    return int(claimed_by.split(":")[1])


def _holding(engine: Engine) -> dict[str, set[int]]:
    """claimed_by -> ids of the ``processing`` rows it holds."""
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT claimed_by, id FROM notifications WHERE status = 'processing'")
        ).all()
    held: dict[str, set[int]] = {}
    for claimed_by, row_id in rows:
        held.setdefault(claimed_by, set()).add(row_id)
    return held


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_killed_workers_rows_come_back_long_before_the_lease(
    engine: Engine, services: Services, slow_receiver: Receiver, make_rows: MakeRows
) -> None:
    services.env.update(
        NOTIFIER_WEBHOOK_ALLOW_HTTP="true",
        NOTIFIER_WEBHOOK_ALLOWED_NETWORKS="127.0.0.0/8",
        NOTIFIER_HEARTBEAT_SECONDS=str(HEARTBEAT),
        NOTIFIER_LEASE_SECONDS=str(LEASE),  # the default: only the heartbeat can be this quick
        NOTIFIER_BATCH_SIZE="10",
    )
    url = slow_receiver.url.replace("localhost", "127.0.0.1")
    make_rows(100, channel="webhook", recipient=url, subject=lambda i: f"n{i}")
    services.worker("w1", concurrency=1)
    services.worker("w2", concurrency=1)
    services.beat()
    wait_for(lambda: services.children("w1") and services.children("w2"), 30, "both pools")
    victims = {services.pid("w1"), *services.children("w1")}

    def w1_holds() -> bool:
        return any(_pid(cb) in victims for cb in _holding(engine))

    wait_for(w1_holds, 30, "w1 to hold a batch")
    os.killpg(services.pid("w1"), signal.SIGKILL)
    killed_at = time.monotonic()
    for pid in victims:
        wait_for(lambda: process_gone(pid), 10, f"process {pid} of w1 to die")  # noqa: B023
    # Dead, every process of it: what it still holds was in flight when it died.
    in_flight = {i for cb, ids in _holding(engine).items() if _pid(cb) in victims for i in ids}
    assert in_flight, "w1 recorded its batch just before the kill: nothing was in flight"

    def all_of_them(condition: str) -> bool:
        with engine.connect() as conn:
            return bool(
                conn.execute(
                    text(f"SELECT bool_and({condition}) FROM notifications WHERE id = ANY(:ids)"),
                    {"ids": list(in_flight)},
                ).scalar_one()
            )

    wait_for(lambda: all_of_them("rescues = 1"), 60, "w1's rows to be rescued")
    rescued_after = time.monotonic() - killed_at
    # Rescued rows are due at once, behind the rows that waited longer.
    wait_for(lambda: all_of_them("status = 'sent'"), 60, "w1's rows to be sent again")
    sent_after = time.monotonic() - killed_at
    with engine.connect() as conn:
        # A sent row has no last_error: why it was rescued is in its history.
        rows = conn.execute(
            text(
                "SELECT n.claimed_by, n.rescues, n.last_error, a.error FROM notifications n"
                " JOIN notification_attempts a ON a.notification_id = n.id"
                " AND a.outcome = 'rescued' WHERE n.id = ANY(:ids)"
            ),
            {"ids": list(in_flight)},
        ).all()
    assert len(rows) == len(in_flight)
    print(
        f"\n[heartbeat rescue] in_flight={len(in_flight)} rescued_after={rescued_after:.1f}s"
        f" sent_after={sent_after:.1f}s lease={LEASE}s"
    )
    survivors = set(services.children("w2"))
    for claimed_by, rescues, last_error, rescue in rows:
        assert _pid(claimed_by) in survivors
        assert rescues == 1
        assert last_error is None
        assert rescue.startswith("worker gone: ")
    # Far below the lease: the grace, then the next rescue (every few seconds).
    assert rescued_after < 10 * GRACE < LEASE
    wait_for(
        lambda: _holding(engine) == {} and _count_sent(engine) == 100, 60, "the rest to be sent"
    )


def _count_sent(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM notifications WHERE status = 'sent'")
            ).scalar_one()
        )


@pytest.mark.timeout(60)
def test_a_worker_starting_on_due_rows_sends_them_without_beat(
    engine: Engine, services: Services, make_rows: MakeRows
) -> None:
    make_rows(5, next_attempt_at=ago(minutes=1))
    services.env.update(NOTIFIER_DISPATCH_INTERVAL="30")  # and no beat at all
    services.worker("w1", concurrency=1)
    wait_for(lambda: _count_sent(engine) == 5, 40, "the due rows to be sent")
    assert "beat" not in {name for name, _ in services.procs}


@pytest.mark.timeout(60)
def test_a_worker_that_cannot_fit_in_the_connection_limit_refuses_to_start(
    engine: Engine, services: Services
) -> None:
    with engine.connect() as conn:
        allowed = conn.execute(
            text(
                "SELECT current_setting('max_connections')::int"
                " - current_setting('superuser_reserved_connections')::int"
                " - coalesce(current_setting('reserved_connections', true), '0')::int"
            )
        ).scalar_one()
    services.env.update(NOTIFIER_EXPECTED_WORKERS=str(allowed))  # each needs more than one
    worker = services.worker("w1", concurrency=2)
    try:
        code = worker.wait(timeout=45)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the worker started anyway:\n{services.log('w1')[-2000:]}")
    log = services.log("w1")
    assert code != 0
    needed = allowed * (2 * 5 + 2) + 7
    line = (
        f"notifier needs {needed} database connections ({allowed} worker(s) x (2 processes x 5"
        f" + 2) + 7 for metrics and commands), PostgreSQL allows {allowed}"
    )
    assert log.count(line) == 1  # one line, said once
    assert "lower --concurrency or NOTIFIER_EXPECTED_WORKERS, or raise PostgreSQL's" in log
    assert "Traceback" not in log
    assert _count_sent(engine) == 0
