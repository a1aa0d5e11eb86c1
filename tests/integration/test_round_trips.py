"""Round trips to PostgreSQL on the hot path, counted on the wire (``tests.turn_proxy``).

With the database a network hop away, each round trip costs the hop: a batch's claim, its look
before sending with its suppression read, and each group of outcomes are one round trip each,
with no ping, ``BEGIN``, ``COMMIT`` or ``SET`` waited for on their own. These counts are exact, so a
change that adds a round trip to a batch has to say so here.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from notifier.db import make_engine, queue
from notifier.delivery.dispatcher import Dispatcher
from notifier.delivery.outcomes import Plan
from notifier.delivery.recorder import Recorder
from notifier.models import AttemptOutcome, Decision
from notifier.providers import registry_of
from notifier.providers.null import NullProvider
from notifier.settings import Settings
from tests.factories import MakeRows, MakeSettings
from tests.turn_proxy import Turns, counting

#: What a batch of rows for the null provider waits for: the claim, the look before sending
#: with the suppression read, and the one group of outcomes that records it.
BATCH_OF_NULL_ROWS = 3


@pytest.fixture
def counted(database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Turns]]:
    """The proxy's count, with no look again before a wave and no group of outcomes cut short
    by its age: a look again comes when a wave starts more than ``RECHECK_AFTER`` after the last
    look, and a group is recorded early once its oldest outcome has waited ``RECORD_WITHIN``,
    which a loaded machine's slow batch reaches and a quick one does not (each is one round
    trip more: ``Claims.still_wanted``, ``Recorder.record``)."""
    monkeypatch.setattr("notifier.delivery.dispatcher.RECHECK_AFTER", 3600.0)
    monkeypatch.setattr("notifier.delivery.batch.RECORD_WITHIN", 3600.0)
    with counting(database_url) as found:
        yield found


def _engine(url: str, *, ping: bool) -> Engine:
    engine = make_engine(url, ping=ping)
    with engine.connect() as conn:  # the connection's own start-up is not the hot path's
        conn.execute(text("SELECT 1"))
    return engine


def _batch(engine: Engine, settings: Settings, turns: Turns) -> int:
    dispatcher = Dispatcher(engine, registry_of([NullProvider(Settings())]), settings)
    try:
        turns.reset()
        report = dispatcher.run_once()
        assert (report.claimed, report.sent) == (100, 100), report
        return turns.count()
    finally:
        dispatcher.close()
        engine.dispose()


def test_a_batch_of_null_rows_takes_three_round_trips(
    counted: tuple[str, Turns], make_rows: MakeRows, make_settings: MakeSettings
) -> None:
    url, turns = counted
    make_rows(100)
    trips = _batch(_engine(url, ping=False), make_settings(batch_size=100), turns)
    assert trips == BATCH_OF_NULL_ROWS, turns.said()


def test_a_batch_that_tops_itself_up_takes_three_round_trips_a_claim(
    counted: tuple[str, Turns], make_rows: MakeRows, make_settings: MakeSettings
) -> None:
    """While a backlog remains a batch claims more as its rows get under way: each claim costs
    the same three round trips, and the claim that comes back empty one."""
    url, turns = counted
    make_rows(600)
    engine = _engine(url, ping=False)
    fixed = make_settings(batch_size=100, max_batch_size=100)
    dispatcher = Dispatcher(engine, registry_of([NullProvider(Settings())]), fixed)
    try:
        turns.reset()
        (report,) = dispatcher.drain(budget_seconds=60)
        trips = turns.count()
    finally:
        dispatcher.close()
        engine.dispose()
    assert (report.claims, report.sent) == ([100] * 6 + [0], 600)
    # Exact but for one timing effect: a claim that tops the batch up lands while a group of
    # outcomes is being gathered, and the group is recorded in two (on a loaded machine, once
    # or twice a run). A round trip more in every claim would be six more.
    assert 6 * BATCH_OF_NULL_ROWS + 1 <= trips <= 6 * BATCH_OF_NULL_ROWS + 2, turns.said()


def test_the_count_sees_each_ping(
    counted: tuple[str, Turns], make_rows: MakeRows, make_settings: MakeSettings
) -> None:
    """The proxy counts what it is meant to: an engine that pings each connection it hands out
    takes one round trip more for each of the batch's three, and for the connection ``prepare``
    takes (which sends nothing without templates)."""
    url, turns = counted
    make_rows(100)
    trips = _batch(_engine(url, ping=True), make_settings(batch_size=100), turns)
    assert trips == 2 * BATCH_OF_NULL_ROWS + 1, turns.said()


def test_outcomes_history_and_suppressions_are_one_round_trip(
    counted: tuple[str, Turns], engine: Engine, make_rows: MakeRows
) -> None:
    url, turns = counted
    make_rows(3, channel="email", recipient=lambda i: f"u{i}@example.com")
    token = uuid.uuid4()
    with engine.begin() as conn:
        rows = queue.claim_due(conn, limit=3, lease_seconds=60, token=token, worker="w")
    sent, dead, retry = (
        Decision(rows[0].id, "email", AttemptOutcome.sent, provider="email", sent_at=1.7e9),
        Decision(
            rows[1].id, "email", AttemptOutcome.dead, "550 5.1.1 no such mailbox",
            suppress=("email", rows[1].recipient, "550 5.1.1", "bounce"),
        ),
        Decision(rows[2].id, "email", AttemptOutcome.retry, "451 try later"),
    )  # fmt: skip
    through = _engine(url, ping=False)
    try:
        turns.reset()
        changed = Recorder(through, "w", within=10).record(token, Plan([sent, dead, retry]))
        trips = turns.count()
    finally:
        through.dispose()
    assert (changed, trips) == (3, 1)
    with engine.begin() as conn:
        statuses = conn.execute(text("SELECT status FROM notifications ORDER BY id")).scalars()
        attempts = conn.execute(text("SELECT count(*) FROM notification_attempts")).scalar()
        suppressed = conn.execute(text("SELECT recipient, kind FROM suppressions")).all()
    assert list(statuses) == ["sent", "dead", "pending"]
    assert attempts == 3
    assert [tuple(s) for s in suppressed] == [("u2@example.com", "bounce")]


def test_a_record_the_database_refuses_is_rolled_back_whole_and_recorded_plainly(
    counted: tuple[str, Turns], engine: Engine, make_rows: MakeRows
) -> None:
    """The outcomes and suppressions of one trip are one transaction: when the database
    refuses the suppression, nothing of the trip stays, the connection is not handed out again
    in a failed state, and the row is recorded plainly, as any refused record is."""
    url, _turns = counted
    make_rows(1, channel="email", recipient="ann@example.com")
    token = uuid.uuid4()
    with engine.begin() as conn:
        (row,) = queue.claim_due(conn, limit=1, lease_seconds=60, token=token, worker="w")
    refused = Decision(
        row.id, "email", AttemptOutcome.dead, "550 5.1.1",
        suppress=("email", "ann@example.com", "550 5.1.1", "no-such-kind"),
    )  # fmt: skip
    through = _engine(url, ping=False)
    try:
        changed = Recorder(through, "w", within=10).record(token, Plan([refused]))
        with through.connect() as conn:  # the pool's next connection works
            assert conn.execute(text("SELECT 1")).scalar() == 1
    finally:
        through.dispose()
    assert changed == 1
    with engine.begin() as conn:
        status, error = conn.execute(text("SELECT status, last_error FROM notifications")).one()
        kept = conn.execute(text("SELECT count(*) FROM suppressions")).scalar()
        history = conn.execute(text("SELECT count(*) FROM notification_attempts")).scalar()
    assert (status, kept, history) == ("dead", 0, 0)
    assert "its outcome could not be stored" in error
