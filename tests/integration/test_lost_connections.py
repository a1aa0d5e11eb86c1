"""A connection the server ended is tried again, whichever way a statement reached it.

The dispatcher's steps run until done while the database is away (``durable.until_done``): it
retries SQLAlchemy's ``OperationalError``. Statements sent through the psycopg connection under
a SQLAlchemy one (``db.driver``) must raise that too, not psycopg's own error, or a recheck cut
off by a PostgreSQL restart drops its batch, sends included, and those rows are sent again by
whoever rescues them. Each test ends the pooled connection's backend for real
(``pg_terminate_backend``, proven by the server) before the step runs on it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import OperationalError

from notifier.db import audience, make_engine, queue, suppressions
from notifier.delivery.durable import each_until_done
from notifier.models import AttemptOutcome, Decision

Step = Callable[[Connection], Any]
TOKEN = uuid.uuid4()

STEPS: dict[str, Step] = {
    "claim": lambda c: queue.claim_due(c, limit=10, lease_seconds=30, token=TOKEN, worker="w"),
    "recheck": lambda c: queue.recheck(c, TOKEN, [1, 2]),
    "record": lambda c: queue.record_outcomes(
        c, TOKEN, [Decision(1, "email", AttemptOutcome.sent)], "w"
    ),
    "suppressed": lambda c: suppressions.suppressed(c, [("email", "a@example.com", "")]),
    "suppress_many": lambda c: suppressions.suppress_many(
        c, [("email", "b@example.com", "bounced", "bounce")]
    ),
}


@pytest.fixture
def one_connection(database_url: str) -> Iterator[Engine]:
    """An engine of one pooled connection, never pinged: as the dispatcher's hot path runs."""
    eng = make_engine(database_url, ping=False, pool_size=1, overflow=0)
    yield eng
    eng.dispose()


@pytest.mark.parametrize("name", sorted(STEPS))
def test_a_step_on_a_connection_the_server_ended_is_run_again(
    name: str, one_connection: Engine, engine: Engine
) -> None:
    with one_connection.connect() as conn:
        backend = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
    with engine.connect() as admin:  # the fault, for real
        ended = admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": backend})
        assert ended.scalar_one() is True
    backends: list[int] = []

    def run(conn: Connection) -> Any:
        """The step, straight away on the first try: on the connection the server ended."""
        if backends:
            backends.append(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
        else:
            backends.append(backend)
        return STEPS[name](conn)

    each_until_done(one_connection, run, within=10)
    assert len(backends) == 2, backends
    assert backends[1] != backend


def test_an_audience_copy_cut_off_by_the_server_raises_as_sqlalchemy_does(engine: Engine) -> None:
    """A campaign's codes (or audience) copied in while PostgreSQL ends the connection: the
    error is SQLAlchemy's ``OperationalError``, as any statement's, and the connection is
    discarded, not psycopg's own error on a connection the pool would hand out again."""
    ended: list[bool] = []
    with engine.connect() as conn:
        backend = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()

        def codes() -> Iterator[str]:
            yield "K0"
            with engine.connect() as admin:  # the fault, for real, mid-COPY
                stop = text("SELECT pg_terminate_backend(:pid)")
                ended.append(admin.execute(stop, {"pid": backend}).scalar_one())
            yield from (f"K{n}" for n in range(1, 50_000))

        with pytest.raises(OperationalError):
            audience.import_codes(conn, 1, codes())
        assert ended == [True]
        assert conn.invalidated
