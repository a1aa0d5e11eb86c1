"""The statements of ``notifier.db`` against a real PostgreSQL."""

from __future__ import annotations

import json
import os
import re
import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, Engine, TextClause, text

from notifier.api import keys
from notifier.db import api, producers, queue, rescue
from notifier.db.engine import driver
from notifier.db.sql import number_array, text_array
from notifier.models import AttemptOutcome, Decision
from tests.commands import run
from tests.factories import MakeRow, MakeRows

OUT = AttemptOutcome


def test_claim_is_exclusive_and_counts_the_attempt(engine: Engine, make_rows: MakeRows) -> None:
    ids = make_rows(5)
    with engine.begin() as conn:
        first = queue.claim_due(conn, limit=3, lease_seconds=60, token=uuid.uuid4(), worker="a")
    with engine.begin() as conn:
        second = queue.claim_due(conn, limit=10, lease_seconds=60, token=uuid.uuid4(), worker="b")
    assert len(first) == 3
    assert len(second) == 2
    assert {n.id for n in first} | {n.id for n in second} == set(ids)
    assert all(n.attempts == 1 for n in first + second)


def test_one_statement_records_every_kind_of_outcome(engine: Engine, make_rows: MakeRows) -> None:
    ids = make_rows(6)
    token = uuid.uuid4()
    later = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    with engine.begin() as conn:
        queue.claim_due(conn, limit=5, lease_seconds=60, token=token, worker="a")
        sent, retry, deferred, dead, cancelled, unclaimed = ids
        changes = [
            Decision(
                sent,
                "null",
                OUT.sent,
                message_id="m-1",
                provider="null",
                sent_at=1.7e9,
                duration_ms=12,
            ),
            Decision(retry, "null", OUT.retry, error="timed out", at=later, provider="null"),
            Decision(deferred, "null", OUT.deferred, error="HTTP 429", at=later),
            Decision(dead, "null", OUT.dead, error="550 no such user"),
            Decision(cancelled, "null", OUT.cancelled, error="expired"),
            Decision(unclaimed, "null", OUT.sent),  # not held by this claim: changes nothing
        ]
        assert queue.record_outcomes(conn, token, changes, worker="a") == 5
        rows = {
            r.id: r
            for r in conn.execute(
                text(
                    "SELECT id, status, attempts, deferrals, last_error, next_attempt_at,"
                    " provider_message_id, provider, sent_at, locked_until FROM notifications"
                )
            )
        }
        history = conn.execute(
            text(
                "SELECT notification_id, attempt, worker, outcome, error, duration_ms, provider"
                " FROM notification_attempts ORDER BY notification_id"
            )
        ).all()
    assert rows[sent].status == "sent"
    assert rows[sent].provider_message_id == "m-1"
    assert rows[sent].sent_at == datetime.fromtimestamp(1.7e9, UTC)
    assert rows[sent].last_error is None
    assert rows[sent].provider == "null"
    assert (rows[retry].status, rows[retry].attempts, rows[retry].deferrals) == ("pending", 1, 0)
    assert rows[retry].next_attempt_at == later
    assert rows[retry].last_error == "timed out"
    assert rows[retry].provider is None  # only a send sets the provider
    assert (rows[deferred].status, rows[deferred].attempts) == ("pending", 0)
    assert rows[deferred].deferrals == 1
    assert rows[deferred].next_attempt_at == later
    assert (rows[dead].status, rows[dead].last_error) == ("dead", "550 no such user")
    assert (rows[cancelled].status, rows[cancelled].last_error) == ("cancelled", "expired")
    assert rows[unclaimed].status == "pending"
    assert rows[unclaimed].sent_at is None
    assert all(rows[i].locked_until is None for i in ids)
    assert [tuple(h) for h in history] == [
        (sent, 1, "a", "sent", None, 12, "null"),
        (retry, 1, "a", "retry", "timed out", None, "null"),
        (deferred, 1, "a", "deferred", "HTTP 429", None, None),
        (dead, 1, "a", "dead", "550 no such user", None, None),
        (cancelled, 1, "a", "cancelled", "expired", None, None),
    ]


def test_late_write_with_an_old_token_changes_nothing(engine: Engine, make_row: MakeRow) -> None:
    row_id = make_row()
    old = uuid.uuid4()
    with engine.begin() as conn:
        queue.claim_due(conn, limit=1, lease_seconds=60, token=old, worker="a")
        conn.execute(text("UPDATE notifications SET locked_until = now() - interval '1s'"))
        assert rescue.rescue_expired(conn) == {"pending": 1, "dead": 0}
        new = uuid.uuid4()
        assert len(queue.claim_due(conn, limit=1, lease_seconds=60, token=new, worker="b")) == 1
        late = Decision(row_id, "null", OUT.sent, message_id="late")
        assert queue.record_outcomes(conn, old, [late]) == 0
        ok = Decision(row_id, "null", OUT.sent, message_id="ok", provider="null")
        assert queue.record_outcomes(conn, new, [ok]) == 1
        row = conn.execute(text("SELECT status, attempts, rescues FROM notifications")).one()
        history = conn.execute(
            text("SELECT attempt, worker, outcome FROM notification_attempts")
        ).all()
    assert tuple(row) == ("sent", 2, 1)
    assert [tuple(h) for h in history] == [(1, "a", "rescued")]


@settings(
    max_examples=200,
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(
        st.none() | st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"])),
        max_size=8,
    )
)
def test_a_text_array_literal_reads_back_exactly(engine: Engine, values: list[str | None]) -> None:
    """Whatever a provider or a producer wrote (quotes, backslashes, braces, commas, NULL as
    a word, new lines), the literal ``record_outcomes`` sends is read back as written."""
    with engine.connect() as conn:
        back = conn.execute(
            text("SELECT CAST(:values AS text[])"), {"values": text_array(values)}
        ).scalar_one()
    assert back == values


def _insert_due(engine: Engine, rows: int) -> None:
    """``rows`` due rows in one INSERT, as a bulk producer or a campaign writes them; the table
    is not analyzed afterwards."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO notifications (channel, recipient)"
                " SELECT 'null', 'r' || n FROM generate_series(1, :rows) AS n"
            ),
            {"rows": rows},
        )


def _plan(conn: Connection, statement: str | TextClause, params: dict[str, object]) -> str:
    """The plan PostgreSQL would run ``statement`` with (a driver-format string, as
    ``CLAIM_DUE``, or a SQLAlchemy ``text()``), as one string."""
    if isinstance(statement, TextClause):
        rows = conn.execute(text(f"EXPLAIN {statement.text}"), params).all()
    else:
        with driver(conn).cursor() as cur:
            rows = cur.execute(f"EXPLAIN {statement}", params).fetchall()
    return "\n".join(str(r[0]) for r in rows)


def test_a_claim_reads_the_due_index_in_order_even_before_any_analyze(engine: Engine) -> None:
    """Right after a bulk INSERT (no ANALYZE yet) the planner would read every due row and sort
    them for the LIMIT; under ``CLAIM_PLAN`` it walks ``notification_queue_due`` and stops, and
    finds the rows it claims by their keys."""
    _insert_due(engine, 100_000)
    params = queue.claim_parameters(uuid.uuid4(), "w", 60, 1000, queue.ReadLimits())
    with engine.begin() as conn:
        first = int(conn.execute(text("SELECT min(id) FROM notifications")).scalar_one())
        driver(conn).execute(queue.CLAIM_PLAN)
        plan = _plan(conn, queue.CLAIM_DUE, params)
        claimed = queue.claim_due(
            conn, limit=1000, lease_seconds=60, token=uuid.uuid4(), worker="w"
        )
    assert "Index Scan using notification_queue_due" in plan, plan
    assert "notifications_due" not in plan, plan
    assert "Sort" not in plan, plan
    # The LIMIT took the thousand that waited longest.
    assert sorted(n.id for n in claimed) == list(range(first, first + 1000))


@pytest.mark.parametrize("keys", [2, 1000])
def test_the_look_for_an_idempotency_key_probes_its_index(engine: Engine, keys: int) -> None:
    """Each request looks for its keys' first use on their rows and in ``api_requests``: one
    probe of each table's unique index a key, not a scan of every request ever made (what a set
    of keys joined by ``IN`` was planned as on a table of 20,000)."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO api_requests (dedupe_key, key_id, body_hash, notification_id)"
                " SELECT 'k' || n, 1, '\\x00', n FROM generate_series(1, 20000) AS n"
            )
        )
        conn.execute(
            text(
                "INSERT INTO notifications (channel, recipient, dedupe_key, request_hash, producer)"
                " SELECT 'null', 'x', 'r' || n, '\\x01', 'billing'"
                " FROM generate_series(1, 20000) AS n"
            )
        )
        conn.execute(text("ANALYZE api_requests"))
        conn.execute(text("ANALYZE notifications"))
        wanted = [f"new{n}" for n in range(keys - 2)] + ["k7", "r9"]
        params: dict[str, object] = {"keys": json.dumps(wanted), "producer": "billing"}
        plan = _plan(conn, api.FIRST_REQUESTS, params)
        found = api.first_requests(conn, "billing", wanted)
        elsewhere = api.first_requests(conn, "shipping", wanted)
        r9 = conn.execute(text("SELECT id FROM notifications WHERE dedupe_key = 'r9'")).scalar_one()
    assert "api_requests_pkey" in plan, plan
    assert "notifications_dedupe_key_key" in plan, plan
    assert "Seq Scan" not in plan, plan
    assert found == {"k7": (b"\x00", 7), "r9": (b"\x01", r9)}
    assert elsewhere == {"k7": (b"\x00", 7)}  # a row is another producer's request


def test_a_look_at_claimed_rows_reads_them_by_id_alone(engine: Engine, make_rows: MakeRows) -> None:
    """The lease index keeps an entry for every row version ever claimed until a vacuum: a
    look that used it would slow down as a drain goes on."""
    ids = make_rows(3)
    token = uuid.uuid4()
    with engine.begin() as conn:
        queue.claim_due(conn, limit=2, lease_seconds=60, token=token, worker="w")
        plan = _plan(conn, queue.RECHECK, {"token": token, "ids": number_array(ids)})
        held, paused = queue.recheck(conn, token, ids)
    assert "notifications_lease" not in plan, plan
    assert held == set(ids[:2])
    assert paused == set()


@pytest.mark.parametrize("rows", [10_000, 100_000])
def test_a_group_of_outcomes_is_written_by_key_lookups(engine: Engine, rows: int) -> None:
    """The planner takes a claim token to hold one row, so for a large group it would rather
    scan the whole table for the token's rows than look the group's rows up one by one, or
    (a table of 10,000 rows never analyzed) walk the whole primary key and compare each row
    with every outcome of the group; under ``RECORD_PLAN`` it looks them up by their key."""
    _insert_due(engine, rows)
    token = uuid.uuid4()
    with engine.begin() as conn:
        claimed = queue.claim_due(conn, limit=1000, lease_seconds=60, token=token, worker="w")
    group = [Decision(n.id, "null", OUT.sent, provider="null", sent_at=1.7e9) for n in claimed]
    columns = ("outcomes", "errors", "next_at", "message_ids", "providers", "sent_at", "durations")
    params = {
        "token": token,
        "worker": "w",
        "ids": number_array(t.id for t in group),
        **dict.fromkeys(columns, "{}"),
    }
    with engine.begin() as conn:
        for setting in queue.RECORD_PLAN:
            driver(conn).execute(setting)
        plan = _plan(conn, queue.RECORD_OUTCOMES, params)
        changed = queue.record_outcomes(conn, token, group, "w")
    lines = plan.splitlines()
    [scan] = [i for i, line in enumerate(lines) if "Scan" in line and "notifications n" in line]
    assert "Index Scan using notifications_pkey on notifications n" in lines[scan], plan
    assert "Index Cond: (id = " in lines[scan + 1], plan
    assert "Join Filter" not in plan, plan
    assert changed == 1000


def test_the_rescue_finds_leases_through_the_lease_index(engine: Engine) -> None:
    _insert_due(engine, 100_000)
    with engine.begin() as conn:
        conn.execute(text("ANALYZE notifications"))
        plan = _plan(conn, rescue.RESCUE_EXPIRED, {"limit": 1000})
    assert "notifications_lease" in plan, plan


def test_a_row_sent_after_a_retry_or_a_requeue_keeps_no_last_error(
    engine: Engine, make_row: MakeRow, capsys: pytest.CaptureFixture[str]
) -> None:
    """The error of an earlier attempt stays in the history, not beside ``status sent``."""
    retried = make_row()
    requeued = make_row(status="dead", last_error="550 mailbox full")

    def attempt(row_id: int, outcome: AttemptOutcome, error: str | None = None) -> None:
        token = uuid.uuid4()
        with engine.begin() as conn:
            conn.execute(text("UPDATE notifications SET next_attempt_at = now()"))
            [claimed] = queue.claim_due(conn, limit=1, lease_seconds=60, token=token, worker="w")
            assert claimed.id == row_id
            at = datetime.now(UTC)
            change = Decision(row_id, "null", outcome, error=error, at=at, sent_at=1e9)
            assert queue.record_outcomes(conn, token, [change], worker="w") == 1

    attempt(retried, OUT.retry, "timed out")
    attempt(retried, OUT.sent)
    assert run(capsys, "requeue", "--id", str(requeued), "--yes")[0] == 0
    attempt(requeued, OUT.sent)
    with engine.connect() as conn:
        rows = dict(conn.execute(text("SELECT id, last_error FROM notifications")).all())
        errors = conn.execute(
            text("SELECT error FROM notification_attempts WHERE notification_id = :id"),
            {"id": retried},
        ).scalars()
        assert sorted(map(str, errors)) == ["None", "timed out"]
    assert rows == {retried: None, requeued: None}
    for row_id in (retried, requeued):
        code, out, _ = run(capsys, "show", str(row_id))
        assert code == 0
        assert re.search(r"^  status +sent$", out, re.MULTILINE), out
        assert not re.search(r"^  last_error +\S", out, re.MULTILINE), out


def _staged_row(key: str | None) -> dict[str, object]:
    row: dict[str, object] = dict.fromkeys(producers.STAGED)
    return {**row, "channel": "null", "recipient": "x", "payload": "{}", "dedupe_key": key,
            "max_attempts": 5, "priority": 0}  # fmt: skip


def _write(conn: Connection, *dedupe_keys: str | None) -> list[tuple[int, str | None]]:
    staged = [_staged_row(key) for key in dedupe_keys]
    hashes = [None if k is None else k.encode() for k in dedupe_keys]
    return api.write_requests(conn, staged, hashes)


def test_rows_staged_twice_in_a_transaction_are_each_written_once(engine: Engine) -> None:
    with engine.begin() as conn:
        api.create_key(conn, keys.make("p").row)
        first = _write(conn, "s:1", None)
        again = _write(conn, "s:1", "s:2")
    with engine.begin() as conn:  # the staging table is empty for the next transaction
        later = _write(conn, "s:3", "s:4")
        one = _write(conn, "s:5")
        staged = conn.execute(text("SELECT count(*) FROM api_staging")).scalar_one()
        written = conn.execute(text("SELECT count(*) FROM notifications")).scalar_one()
        kept = conn.execute(
            text("SELECT dedupe_key, request_hash FROM notifications ORDER BY id")
        ).all()
    assert [key for _, key in first] == ["s:1", None]
    assert [key for _, key in again] == ["s:2"]  # s:1 exists: left out, not written twice
    assert [key for _, key in later] == ["s:3", "s:4"]
    assert [key for _, key in one] == ["s:5"]
    assert (staged, written) == (2, 6)  # this transaction's own rows, until it commits
    ids = [i for i, _ in first + again + later + one]
    assert ids == sorted(ids)
    # each keyed row's request kept on it; the keyless row's none
    hashes = [(f"s:{n}", f"s:{n}".encode()) for n in range(1, 6)]
    assert kept == [hashes[0], (None, None), *hashes[1:]]


def test_a_batch_with_one_key_twice_is_refused_before_it_is_written(engine: Engine) -> None:
    with engine.begin() as conn:
        api.create_key(conn, keys.make("p").row)
        with pytest.raises(ValueError, match="one dedupe_key"):
            _write(conn, "d:1", None, "d:1")
