"""Batches of idempotency keys never fill PostgreSQL's lock table.

Each key a request holds is an advisory lock until its transaction ends, and the server's lock
table is shared by every session: a dozen batches of 1,000 keys at once fill it, and then any
session that needs a lock fails ("out of shared memory"). The first test makes that happen for
real, through the API, with the batch slots turned off; the second shows the slots
(``notifier.db.api.take_batch_slot``) keep the keys held at once to their share of the table,
every batch written. Each insert is slowed by a second (a statement trigger) so that the
batches' transactions overlap whatever the machine's speed.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, text

from notifier.api import keys
from notifier.api.app import create_app
from notifier.db import api as api_db
from notifier.db import make_engine
from tests.console_server import free_port, serving
from tests.db_faults import slow_insert_statements
from tests.factories import MakeSettings

BATCHES = 16
ITEMS = 1000


class LockWatch:
    """Samples, every 20 ms, the advisory locks held on the server and whether one is waited
    for."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.most = 0
        self.waited = False
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        with self.engine.connect() as conn:
            while not self.stop.is_set():
                held, waiting = conn.execute(
                    text(
                        "SELECT count(*) FILTER (WHERE granted),"
                        " count(*) FILTER (WHERE NOT granted)"
                        " FROM pg_locks WHERE locktype = 'advisory'"
                    )
                ).one()
                conn.rollback()
                self.most = max(self.most, int(held))
                self.waited = self.waited or int(waiting) > 0
                self.stop.wait(0.02)

    def __enter__(self) -> LockWatch:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(10)


@pytest.fixture
def wide(database_url: str) -> Iterator[Engine]:
    """An engine with a connection for each batch, so that all of them can be under way."""
    engine = make_engine(database_url, pool_size=BATCHES + 2, overflow=0)
    yield engine
    engine.dispose()


def _batches(engine: Engine, wide: Engine, settings: Any) -> list[httpx.Response]:
    made = keys.make("bulk")
    with engine.begin() as conn:
        api_db.create_key(conn, made.row)
    slow_insert_statements(engine, 1)
    answers: list[httpx.Response] = []
    start = threading.Barrier(BATCHES)
    with serving(create_app(settings, wide, None), free_port()) as url:

        def send() -> None:
            items = [
                {"idempotency_key": uuid.uuid4().hex, "channel": "null", "to": f"u{i}"}
                for i in range(ITEMS)
            ]
            start.wait()
            answers.append(
                httpx.post(
                    f"{url}/v1/notifications/batch",
                    json={"notifications": items},
                    headers={"Authorization": f"Bearer {made.key}"},
                    timeout=120,
                )
            )

        threads = [threading.Thread(target=send) for _ in range(BATCHES)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
    assert len(answers) == BATCHES
    return answers


def _table(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(api_db.LOCK_TABLE).scalar_one())


def test_without_slots_batches_fill_the_lock_table(
    engine: Engine, wide: Engine, make_settings: MakeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert 2 * _table(engine) < BATCHES * ITEMS  # more than the table holds, with its slack
    monkeypatch.setattr(api_db, "SLOTLESS_KEYS", 10**9)  # no batch takes a slot
    with LockWatch(engine) as watch:
        answers = _batches(engine, wide, make_settings())
    statuses = sorted(a.status_code for a in answers)
    # The fault, for real: the table filled and some batches' locks were refused; they are
    # answered 503 (nothing written for them), never 500.
    assert set(statuses) == {200, 503}, statuses
    assert watch.most > _table(engine)


def test_batch_slots_keep_the_keys_held_within_the_lock_table(
    engine: Engine, wide: Engine, make_settings: MakeSettings
) -> None:
    with engine.connect() as conn:
        slots = api_db.batch_slots(conn, ITEMS)
    assert slots == max(1, _table(engine) // (2 * ITEMS))
    with LockWatch(engine) as watch:
        answers = _batches(engine, wide, make_settings(api_max_batch=ITEMS))
    assert [a.status_code for a in answers] == [200] * BATCHES, [a.text[:200] for a in answers]
    assert all(r["status"] == "created" for a in answers for r in a.json()["results"])
    with engine.connect() as conn:
        written = conn.execute(text("SELECT count(*) FROM notifications")).scalar_one()
    assert written == BATCHES * ITEMS
    # Batches waited for a slot, and the keys held at once never passed the slots' share.
    assert watch.waited
    assert watch.most <= slots * (ITEMS + 1), (watch.most, slots)
