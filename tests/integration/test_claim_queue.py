"""``notification_queue``: what the claim reads, kept by triggers on ``notifications`` (0029).

The rule every test here checks: each pending row has exactly one entry, with its priority and
its time, and every entry is a pending row's; whatever wrote the rows.
"""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, Engine, text

from notifier.db import queue
from notifier.db.engine import driver
from notifier.models import AttemptOutcome, Decision
from tests.db_faults import hold_updates, lock_waiters, wait_until
from tests.factories import write_row

OPERATIONS_DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
ENTRIES = "SELECT id, priority, next_attempt_at FROM notification_queue ORDER BY id"
PENDING = (
    "SELECT id, priority, next_attempt_at FROM notifications WHERE status = 'pending' ORDER BY id"
)


def _repair_statement() -> str:
    """The SQL docs/operations.md gives for queueing pending rows that have no entry."""
    section = OPERATIONS_DOC.read_text().split("## The claim's queue", 1)[1]
    return section.split("```sql", 1)[1].split("```", 1)[0]


def _entries_match_pending_rows(conn: Connection) -> None:
    entries = conn.execute(text(ENTRIES)).all()
    assert entries == conn.execute(text(PENDING)).all()


def _insert(conn: Connection, n: int, **columns: object) -> list[int]:
    """``n`` rows as producers write them, on the test's connection and in its transaction."""
    return [write_row(conn, recipient=f"r{i}", **columns) for i in range(n)]


def _claim(conn: Connection, limit: int = 1000) -> tuple[uuid.UUID, list[int]]:
    token = uuid.uuid4()
    claimed = queue.claim_due(conn, limit=limit, lease_seconds=60, token=token, worker="w")
    return token, [n.id for n in claimed]


def test_every_way_into_and_out_of_pending_keeps_one_entry_a_pending_row(engine: Engine) -> None:
    with engine.begin() as conn:
        a, b, c, d, e = _insert(conn, 5)
        conn.execute(
            text(
                "INSERT INTO notifications (channel, recipient, status)"
                " VALUES ('null', 'c', 'cancelled')"
            )
        )
        conn.execute(
            text(
                "INSERT INTO notifications (channel, recipient, priority)"
                " SELECT 'null', 'many' || g, g FROM generate_series(1, 3) AS g"
            )
        )
        _entries_match_pending_rows(conn)
        conn.execute(text("DELETE FROM notifications WHERE recipient LIKE 'many%'"))
        _entries_match_pending_rows(conn)
        # A claim takes its rows' entries; a retry gives one back, at the retry's time.
        token, claimed = _claim(conn)
        assert sorted(claimed) == [a, b, c, d, e]
        assert conn.execute(text(ENTRIES)).all() == []
        retry = Decision(
            a, "null", AttemptOutcome.retry, error="x", at=datetime(2033, 5, 18, tzinfo=UTC)
        )
        sent = [Decision(i, "null", AttemptOutcome.sent, sent_at=1e9) for i in (b, c, d, e)]
        assert queue.record_outcomes(conn, token, [retry, *sent], worker="w") == 5
        _entries_match_pending_rows(conn)
        assert [r.id for r in conn.execute(text(ENTRIES))] == [a]
        # Rescheduled, reprioritized, cancelled, deleted: always the row's current key or none.
        conn.execute(
            text("UPDATE notifications SET next_attempt_at = now() WHERE id = :a"), {"a": a}
        )
        conn.execute(text("UPDATE notifications SET priority = 7 WHERE id = :a"), {"a": a})
        _entries_match_pending_rows(conn)
        conn.execute(text("UPDATE notifications SET status = 'cancelled' WHERE id = :a"), {"a": a})
        _entries_match_pending_rows(conn)
        [f] = _insert(conn, 1)
        conn.execute(text("DELETE FROM notifications WHERE id = :f"), {"f": f})
        _entries_match_pending_rows(conn)
        _insert(conn, 3)
        conn.execute(text("TRUNCATE notifications RESTART IDENTITY CASCADE"))
        assert conn.execute(text(ENTRIES)).all() == []


OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.integers(-2, 2), st.integers(-5, 5)),
        st.tuples(st.just("claim"), st.integers(1, 4), st.just(0)),
        st.tuples(st.just("retry"), st.integers(-5, 5), st.just(0)),
        st.tuples(st.just("reschedule"), st.integers(0, 9), st.integers(-5, 5)),
        st.tuples(st.just("reprioritize"), st.integers(0, 9), st.integers(-2, 2)),
        st.tuples(st.just("cancel"), st.integers(0, 9), st.just(0)),
        st.tuples(st.just("delete"), st.integers(0, 9), st.just(0)),
        st.tuples(st.just("rescue"), st.integers(0, 9), st.just(0)),
    ),
    max_size=25,
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(operations=OPERATIONS)
def test_any_sequence_of_writes_leaves_one_entry_per_pending_row_and_claims_in_order(
    engine: Engine, operations: list[tuple[str, int, int]]
) -> None:
    """Rows inserted, claimed, retried, rescheduled, reprioritized, cancelled, deleted and
    rescued in any order: after each step the entries are the pending rows' keys, and a claim
    takes the due pending rows in the order ``notifications`` alone gives."""
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE notifications RESTART IDENTITY CASCADE"))
        held: dict[int, uuid.UUID] = {}
        for name, n, m in operations:
            ids = conn.execute(text("SELECT id FROM notifications ORDER BY id")).scalars().all()
            pick = ids[n % len(ids)] if ids else None
            if name == "insert":
                _insert(
                    conn,
                    1,
                    priority=n,
                    next_attempt_at=datetime.now(UTC) + timedelta(minutes=m),
                )
            elif name == "claim":
                expected = (
                    conn.execute(
                        text(
                            "SELECT id FROM notifications WHERE status = 'pending'"
                            " AND next_attempt_at <= now()"
                            " ORDER BY priority DESC, next_attempt_at, id LIMIT :n"
                        ),
                        {"n": n},
                    )
                    .scalars()
                    .all()
                )
                token, claimed = _claim(conn, n)
                assert sorted(claimed) == sorted(expected)
                held.update(dict.fromkeys(claimed, token))
            elif name == "retry" and held:
                row, token = held.popitem()
                at = datetime.now(UTC) + timedelta(minutes=n)
                retry = Decision(row, "null", AttemptOutcome.retry, error="x", at=at)
                queue.record_outcomes(conn, token, [retry], worker="w")
            elif pick is not None and name == "reschedule":
                conn.execute(
                    text(
                        "UPDATE notifications SET next_attempt_at = now()"
                        " + make_interval(mins => :m) WHERE id = :id"
                    ),
                    {"m": m, "id": pick},
                )
            elif pick is not None and name == "reprioritize":
                conn.execute(
                    text("UPDATE notifications SET priority = :p WHERE id = :id"),
                    {"p": m, "id": pick},
                )
            elif pick is not None and name == "cancel":
                conn.execute(
                    text(
                        "UPDATE notifications SET status = 'cancelled', locked_until = NULL"
                        " WHERE id = :id AND status IN ('pending', 'processing')"
                    ),
                    {"id": pick},
                )
                held.pop(pick, None)
            elif pick is not None and name == "delete":
                conn.execute(text("DELETE FROM notifications WHERE id = :id"), {"id": pick})
                held.pop(pick, None)
            elif pick is not None and name == "rescue" and pick in held:
                conn.execute(
                    text(
                        "UPDATE notifications SET status = 'pending', locked_until = NULL"
                        " WHERE id = :id AND status = 'processing'"
                    ),
                    {"id": pick},
                )
                held.pop(pick)
            _entries_match_pending_rows(conn)


def test_a_claim_skips_a_row_a_producer_holds_and_neither_deadlocks(
    engine: Engine, database_url: str
) -> None:
    """A producer's open transaction holds a due row (it changed its body): a claim takes the
    rows beside it at once. The producer then reschedules the row while the claim's
    transaction is still open: it waits for that transaction (the claim holds the row's entry
    it skipped), not the other way round, so there is no deadlock to break, and both commit.
    The row is then claimed at its new time."""
    with engine.begin() as conn:
        held, *others = _insert(conn, 4)
    url = database_url.replace("postgresql+psycopg://", "postgresql://")
    failures: list[BaseException] = []
    with psycopg.connect(url) as producer, psycopg.connect(url, autocommit=True) as monitor:
        producer.execute("SET lock_timeout = '20s'")
        producer.execute("UPDATE notifications SET body = 'changed' WHERE id = %s", (held,))

        def reschedule() -> None:
            try:
                producer.execute(
                    "UPDATE notifications SET next_attempt_at = now() - interval '1 minute'"
                    " WHERE id = %s",
                    (held,),
                )
            except psycopg.Error as exc:
                failures.append(exc)

        thread = threading.Thread(target=reschedule)
        with engine.connect() as conn:
            with conn.begin():
                driver(conn).execute("SET LOCAL lock_timeout = '20s'")
                _, claimed = _claim(conn)
                assert sorted(claimed) == others
                thread.start()
                # The producer's statement waits on the claim's transaction (seen waiting on a
                # lock, from a session of its own: a transaction sees one picture of
                # pg_stat_activity), which must still be able to finish.
                rescheduling = "UPDATE notifications SET next_attempt_at%"
                wait_until(
                    lambda: lock_waiters(monitor, rescheduling) > 0,
                    "the producer's reschedule to wait on the claim",
                    30.0,
                )
            thread.join(timeout=30)
        assert not thread.is_alive()
        assert failures == []
        producer.commit()
    with engine.begin() as conn:
        _entries_match_pending_rows(conn)
        assert _claim(conn)[1] == [held]


def test_an_entry_whose_row_does_not_match_is_dropped_not_claimed(engine: Engine) -> None:
    """Rows written with triggers off (``session_replication_role = replica``) leave entries
    that do not match their rows: a claim deletes each such entry and claims nothing for it;
    the statement docs/operations.md gives queues the pending rows left without one."""
    with engine.begin() as conn:
        ids = _insert(conn, 3)
        conn.execute(text("SET LOCAL session_replication_role = replica"))
        conn.execute(
            text("UPDATE notifications SET status = 'cancelled' WHERE id = :i"), {"i": ids[0]}
        )
        conn.execute(
            text(
                "UPDATE notifications SET next_attempt_at = now() - interval '1 hour' WHERE id = :i"
            ),
            {"i": ids[1]},
        )
        orphan = _insert(conn, 1)[0]
    with engine.begin() as conn:
        assert _claim(conn)[1] == [ids[2]]
        assert conn.execute(text(ENTRIES)).all() == []
        conn.execute(text(_repair_statement()))
        assert sorted(_claim(conn)[1]) == [ids[1], orphan]


#: The advisory lock a claim waits for in ``hold_updates``.
HOLD = 4242


def test_a_row_written_after_the_claims_snapshot_is_left_queued_for_the_next_claim(
    engine: Engine, database_url: str
) -> None:
    """A producer changes a due row's body and commits after a claim's statement began and
    before it locks the row: the lock finds the row's new version, which the statement's
    snapshot cannot see. The claim takes the rows beside it, and leaves that row pending with
    its entry (not dropped, which would strand it); the next claim takes it."""
    with engine.begin() as conn:
        changed, *others = _insert(conn, 4)
    hold_updates(engine, HOLD)
    url = database_url.replace("postgresql+psycopg://", "postgresql://")
    result: list[list[int]] = []
    failures: list[BaseException] = []

    def claim() -> None:
        try:
            with engine.connect() as conn, conn.begin():
                driver(conn).execute("SET LOCAL test.hold = 'on'")
                driver(conn).execute("SET LOCAL lock_timeout = '20s'")
                result.append(_claim(conn)[1])
        except Exception as exc:  # the test reports it once the thread is joined
            failures.append(exc)

    with psycopg.connect(url, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s)", (HOLD,))
        thread = threading.Thread(target=claim)
        thread.start()
        wait_until(
            lambda: lock_waiters(other, "%notification_queue%", "advisory") == 1,
            "the claim to wait after its snapshot",
            30.0,
        )
        other.execute("UPDATE notifications SET body = 'changed' WHERE id = %s", (changed,))
        other.execute("SELECT pg_advisory_unlock(%s)", (HOLD,))
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert failures == []
    assert sorted(result[0]) == others
    with engine.begin() as conn:
        _entries_match_pending_rows(conn)
        assert _claim(conn)[1] == [changed]
        assert conn.execute(
            text("SELECT body, attempts FROM notifications WHERE id = :i"), {"i": changed}
        ).one() == ("changed", 1)


#: How workers claimed before migration 0029: from ``notifications_due``, leaving the queue.
OLD_CLAIM = """
    UPDATE notifications AS n
       SET status = 'processing', attempts = n.attempts + 1, claim_token = gen_random_uuid(),
           claimed_by = 'old', locked_until = now() + interval '1 minute', updated_at = now()
      FROM (SELECT id FROM notifications
             WHERE status = 'pending' AND next_attempt_at <= now()
             ORDER BY priority DESC, next_attempt_at, id
             LIMIT 4 FOR UPDATE SKIP LOCKED) AS due
     WHERE n.id = due.id
    RETURNING n.id
"""


def test_workers_of_the_old_claim_beside_the_new_claim_each_row_once(engine: Engine) -> None:
    """During an upgrade, workers of the old image claim from ``notifications`` directly and
    leave their rows' entries behind: the new claim takes only the rows they did not, and
    drops the entries they left."""
    with engine.begin() as conn:
        ids = _insert(conn, 10)
        old = sorted(conn.execute(text(OLD_CLAIM)).scalars())
        _, new = _claim(conn)
        assert old == ids[:4]
        assert sorted(new) == ids[4:]
        assert conn.execute(text(ENTRIES)).all() == []
