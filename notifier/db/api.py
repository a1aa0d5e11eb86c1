"""The SQL of the HTTP API (migrations 0026 and 0028): its keys, what each Idempotency-Key was
first asked with, and a key's own rows, read and cancelled.

Every statement that reads or cancels a row names the key's producer in its ``WHERE``: a key
never sees, or learns of, another producer's row (the answer is the same as for no row). Rows
are written by ``write_requests`` after ``open_request`` names the transaction's
``notifier.producer``, which the column's default fills in, or a single request's by
``write_alone``, which does both in one statement.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from notifier.db import producers
from notifier.db.engine import driver, driver_errors
from notifier.db.sql import for_driver

KEY_COLUMNS = "id, name, prefix, secret_hash, channels, categories, read_only, per_second"


@dataclass(frozen=True, slots=True)
class KeyRow:
    """An API key as stored: never the key itself, only its public prefix and its hash."""

    id: int
    name: str
    prefix: str
    secret_hash: bytes
    #: the channels and categories it may write; ``None``: any
    channels: list[str] | None
    categories: list[str] | None
    read_only: bool
    #: requests a second it may make; ``None``: the deployment's default
    per_second: int | None
    created_at: datetime | None = None
    revoked_at: datetime | None = None


def create_key(conn: Connection, key: KeyRow) -> int:
    """Store a new key; its id."""
    return int(
        conn.execute(
            text(
                "INSERT INTO api_keys (name, prefix, secret_hash, channels, categories,"
                " read_only, per_second) VALUES (:name, :prefix, :secret_hash, :channels,"
                " :categories, :read_only, :per_second) RETURNING id"
            ),
            {
                "name": key.name,
                "prefix": key.prefix,
                "secret_hash": key.secret_hash,
                "channels": key.channels,
                "categories": key.categories,
                "read_only": key.read_only,
                "per_second": key.per_second,
            },
        ).scalar_one()
    )


def _rows(conn: Connection, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """The rows of ``sql`` (in the driver's parameter style) run on ``conn``'s psycopg
    connection, in its transaction. For the statements every request runs: SQLAlchemy's layer
    cost about as much CPU again as psycopg's own (about 100 us against 90 a statement, a key's
    read timed in one process)."""
    with driver_errors(conn), driver(conn).cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall()


LIVE_KEY = for_driver(
    f"SELECT {KEY_COLUMNS} FROM api_keys WHERE prefix = :prefix AND revoked_at IS NULL"
)


def live_key(conn: Connection, prefix: str) -> KeyRow | None:
    """The unrevoked key with this prefix, if there is one."""
    found = _rows(conn, LIVE_KEY, {"prefix": prefix})
    return KeyRow(*found[0]) if found else None


def keys(conn: Connection) -> list[KeyRow]:
    """Every key, revoked ones too, oldest first."""
    rows = conn.execute(
        text(f"SELECT {KEY_COLUMNS}, created_at, revoked_at FROM api_keys ORDER BY id")
    )
    return [KeyRow(*row) for row in rows]


def revoke_key(conn: Connection, prefix: str) -> bool:
    """Revoke the key with this prefix; whether a live one was."""
    found = conn.execute(
        text(
            "UPDATE api_keys SET revoked_at = now()"
            " WHERE prefix = :prefix AND revoked_at IS NULL RETURNING id"
        ),
        {"prefix": prefix},
    ).first()
    return found is not None


# Lists travel as one JSON text each: psycopg builds a text[] of a thousand keys in Python, a
# JSON array is one C call.


#: Each key a request holds is one entry in PostgreSQL's lock table until its transaction ends,
#: and that table is shared by every session of the server: it has room for about
#: ``max_locks_per_transaction`` x (``max_connections`` + ``max_prepared_transactions``)
#: entries (6,400 with the defaults; a little more in practice). A dozen batches of 1,000 keys
#: at once would fill it, and every session of the server (workers, producers) would then fail
#: to take a lock ("out of shared memory"). So a request with more keys than this first takes
#: one of a few batch slots (``take_batch_slot``), which keeps the keys held at once by
#: batches to half the table; requests with fewer keys stay within the 64 entries a session
#: is budgeted.
SLOTLESS_KEYS = 64

LOCK_TABLE = text(
    "SELECT current_setting('max_locks_per_transaction')::int"
    " * (current_setting('max_connections')::int"
    " + current_setting('max_prepared_transactions')::int)"
)
TRY_BATCH_SLOT = text(
    "SELECT s FROM generate_series(0, :slots - 1) AS s"
    " WHERE pg_try_advisory_xact_lock(hashtext('notifier.api.batch'), s) LIMIT 1"
)
WAIT_BATCH_SLOT = text(
    "SELECT pg_advisory_xact_lock(hashtext('notifier.api.batch'),"
    " CAST(floor(random() * :slots) AS int))"
)


def batch_slots(conn: Connection, max_batch: int) -> int:
    """How many batches of up to ``max_batch`` keys may hold them at once on this server:
    half its lock table's worth, and at least one."""
    table = int(conn.execute(LOCK_TABLE).scalar_one())
    return max(1, table // (2 * max_batch))


def take_batch_slot(conn: Connection, slots: int) -> None:
    """Hold one of ``slots`` batch slots for this transaction: a free one, else wait for one
    (as long as the statement timeout allows)."""
    if conn.execute(TRY_BATCH_SLOT, {"slots": slots}).first() is None:
        conn.execute(WAIT_BATCH_SLOT, {"slots": slots})


OPEN_REQUEST = for_driver(
    "SELECT set_config('notifier.producer', :name, true),"
    " ARRAY(SELECT k FROM jsonb_array_elements_text(CAST(:keys AS jsonb)) WITH ORDINALITY"
    " AS u(k, n) WHERE pg_try_advisory_xact_lock(hashtextextended(k, 26)) ORDER BY n)"
)


def open_request(conn: Connection, producer: str, dedupe_keys: Sequence[str]) -> set[str]:
    """Name this transaction's producer (rows it writes carry it: the column's default reads
    it) and hold each of ``dedupe_keys`` for it (advisory locks, tried in the order given,
    never waited for), in one statement: the keys it holds now, not those another request
    holds."""
    keys = json.dumps(list(dedupe_keys), ensure_ascii=False)
    [(_, held)] = _rows(conn, OPEN_REQUEST, {"name": producer, "keys": keys})
    return set(held)


# The keys as one array, computed once (an InitPlan), so the unique index is probed for each
# whatever the table's size. Written as ``IN (SELECT jsonb_array_elements_text(...))``, the
# planner took the set for 100 rows and, until the table held 20,000 to 30,000 requests,
# hashed it against a scan of the whole table: every single request read all of them.
# A key's first request is on its row (``request_hash``, which only the API writes) while the
# row is there, in ``api_requests`` once it is gone (the row's delete trigger copies it there)
# or if it was written before migration 0028.
_ASKED = "ANY(ARRAY(SELECT jsonb_array_elements_text(CAST(:keys AS jsonb))))"
FIRST_REQUESTS = text(
    f"""
    SELECT dedupe_key, request_hash, id FROM notifications
     WHERE dedupe_key = {_ASKED} AND request_hash IS NOT NULL AND producer = :producer
    UNION ALL
    SELECT dedupe_key, body_hash, notification_id FROM api_requests
     WHERE dedupe_key = {_ASKED}
"""
)


def first_requests(
    conn: Connection, producer: str, dedupe_keys: Sequence[str]
) -> dict[str, tuple[bytes, int]]:
    """For each of ``dedupe_keys`` that ``producer``'s requests used before: (request hash,
    notification id)."""
    keys = json.dumps(list(dedupe_keys), ensure_ascii=False)
    found = conn.execute(FIRST_REQUESTS, {"keys": keys, "producer": producer})
    return {str(k): (bytes(h), int(n)) for k, h, n in found}


# A request's rows, each keyed one with what it was asked with (``request_hash``), in one
# statement: a row whose dedupe_key exists, or was asked for before (its row may be gone, its
# key is still used: ``api_requests``), is not written, and is left out of what comes back. A
# row without a key has no hash. A single request's key is looked for on the rows before the
# insert, too: a retry of a request is answered from its row without an insert tried first
# (whose triggers, and the wait for the first request's row, a batch's rows pay for).
_INSERT_ONE = f"""
    INSERT INTO notifications ({producers.INSERTED}, request_hash)
    SELECT {producers.VALUES}, CAST(:body_hash AS bytea)
      {{source}}
     WHERE {{condition}} NOT EXISTS (SELECT FROM api_requests WHERE dedupe_key = :dedupe_key)
       AND NOT EXISTS (SELECT FROM notifications WHERE dedupe_key = :dedupe_key)
    ON CONFLICT (dedupe_key) DO NOTHING
"""
WRITE_ONE = for_driver(_INSERT_ONE.format(source="", condition="") + "RETURNING id, dedupe_key")
# A single request's row, in one statement run on its own (autocommit: its implicit
# transaction is the request's): the transaction's producer named, the row's key held (tried,
# never waited for; until the statement's commit), and the row written as ``WRITE_ONE`` writes
# it: one statement for BEGIN, ``OPEN_REQUEST``, ``WRITE_ONE`` and COMMIT, three round trips
# and as many wake-ups of a server process and of the API's thread fewer. A worker's drain on
# the same two cores beside 200 requests a second went from 0.70-0.80 of its rate alone to
# 0.82-0.87 with it (docs/api.md, "Measured"). The CTE is materialized:
# it runs once, before any row is formed, whose producer column's default reads the setting.
# The statement's snapshot is older than the lock it takes: a first request that committed in
# between is not seen by the ``NOT EXISTS`` tests, but its row is by ``ON CONFLICT``, and the
# request is then answered from it (``first_requests``), as a replay or a refusal.
WRITE_ALONE = for_driver(
    f"""
    WITH opened AS MATERIALIZED (
        SELECT set_config('notifier.producer', :name, true),
               CAST(:dedupe_key AS text) IS NULL
               OR pg_try_advisory_xact_lock(hashtextextended(:dedupe_key, 26)) AS held
    ), written AS (
        {_INSERT_ONE.format(source="FROM opened", condition="opened.held AND")}
        RETURNING id
    )
    SELECT (SELECT held FROM opened), (SELECT id FROM written)
"""
)


def write_alone(
    conn: Connection, producer: str, row: Mapping[str, Any], body_hash: bytes | None
) -> tuple[bool, int | None]:
    """Write one row (as ``producers.enqueue_row`` takes it) as ``producer``'s, keyed with its
    request's hash, in one statement that is its own transaction (``conn`` in autocommit):
    whether its key was free to hold, and the row's id, ``None`` if its key was used before
    (by a row, or by a request whose row is gone) or was not free."""
    params = {**row, "name": producer, "body_hash": body_hash}
    [(held, row_id)] = _rows(conn, WRITE_ALONE, params)
    return bool(held), None if row_id is None else int(row_id)


# More rows arrive by COPY into a session's own staging table, stamped with the call that
# staged them, and are inserted in the order given (their ids too, as identity values are drawn
# in that order): no JSON to build or parse, and the table emptied at commit, in one go, not
# row by row (a DELETE of the staged rows cost PostgreSQL about 1.5 us a row of the 13 the
# statements took). A second call in the same transaction reads its own rows only. (The table
# has the name of its columns' version: a session kept by a pooler from an older version's
# process never hands this one a table without the columns it copies into.)
#
# A call's rows are those stamped with its number or a higher one: the same rows, as a
# transaction's calls are numbered upwards (by one process, on one connection) and no other
# transaction's rows outlive it. (When the statement also joined its written rows to the staged
# ones, the planner, with no statistics of a temporary table, took the rows for ``call = n`` to
# be one and joined them in a nested loop: a thousand rows cost a million comparisons.)
STAGE_ROWS = f"""
    CREATE TEMP TABLE IF NOT EXISTS api_staging
           (call bigint, ord integer, body_hash bytea, {producers.ROW_COLUMNS})
    ON COMMIT DELETE ROWS
"""
COPY_STAGED = f"COPY api_staging (call, ord, body_hash, {', '.join(producers.STAGED)}) FROM STDIN"
WRITE_STAGED = f"""
    INSERT INTO notifications ({producers.INSERTED}, request_hash)
    SELECT {producers.FROM_STAGED}, s.body_hash
      FROM api_staging AS s
     WHERE call >= %(call)s
       AND NOT EXISTS (SELECT FROM api_requests AS r WHERE r.dedupe_key = s.dedupe_key)
     ORDER BY ord
    ON CONFLICT (dedupe_key) DO NOTHING
    RETURNING id, dedupe_key
"""
#: Each call's stamp on the rows it stages.
_CALLS = itertools.count()


def write_requests(
    conn: Connection, rows: Sequence[Mapping[str, Any]], hashes: Sequence[bytes | None]
) -> list[tuple[int, str | None]]:
    """Insert rows (each as ``producers.enqueue_row`` takes it, its payload JSON text, no two
    with one dedupe_key) in ``conn``'s transaction, each with its request's hash (``hashes``,
    one a row; ``None`` for a row without a key), in one statement: (id, dedupe_key) of each
    written, in the order given; a row whose key was used (by a row, or by a request before)
    is not among them. One row is one INSERT (one round trip, where staging takes three)."""
    if len(rows) == 1:
        params = {**rows[0], "body_hash": hashes[0]}
        return [(int(i), key) for i, key in _rows(conn, WRITE_ONE, params)]
    keys = [row["dedupe_key"] for row in rows if row["dedupe_key"] is not None]
    if len(set(keys)) != len(keys):
        raise ValueError("two rows of one batch with one dedupe_key")
    raw = driver(conn)
    with driver_errors(conn), raw.cursor() as cur:
        call = next(_CALLS)
        cur.execute(STAGE_ROWS)
        values = producers.STAGED_VALUES
        with cur.copy(COPY_STAGED) as copy:
            for ord_, (row, body_hash) in enumerate(zip(rows, hashes, strict=True)):
                copy.write_row((call, ord_, body_hash, *values(row)))
        cur.execute(WRITE_STAGED, {"call": call})
        return sorted((int(i), key) for i, key in cur.fetchall())


VIEW = """
    SELECT id, channel, profile, category, status, attempts, max_attempts, dedupe_key,
           next_attempt_at, created_at, updated_at, sent_at, last_error, provider,
           delivery_status, delivery_at, campaign_id, parent_id
      FROM notifications
     WHERE producer = :producer AND {which}
"""
BY_ID = text(VIEW.format(which="id = :id"))
BY_KEY = text(VIEW.format(which="dedupe_key = :key"))

HISTORY = text(
    "SELECT attempt, at, outcome, error, provider, duration_ms FROM notification_attempts"
    " WHERE notification_id = :id ORDER BY id"
)


def own_row(
    conn: Connection, producer: str, *, row_id: int | None = None, dedupe_key: str | None = None
) -> dict[str, Any] | None:
    """The producer's row by id or by dedupe key, with its history; ``None`` if it has none."""
    if row_id is not None:
        found = conn.execute(BY_ID, {"producer": producer, "id": row_id}).mappings().first()
    else:
        found = conn.execute(BY_KEY, {"producer": producer, "key": dedupe_key}).mappings().first()
    if found is None:
        return None
    row = dict(found)
    row["history"] = [dict(h) for h in conn.execute(HISTORY, {"id": row["id"]}).mappings()]
    return row


CANCEL = """
    WITH found AS (
        SELECT id, status FROM notifications
         WHERE producer = :producer AND {which}
    ), cancelled AS (
        UPDATE notifications AS n
           SET status = 'cancelled', updated_at = now(), locked_until = NULL,
               last_error = :reason
          FROM found
         WHERE n.id = found.id AND n.status IN ('pending', 'processing')
        RETURNING n.id
    )
    SELECT found.id, found.status, EXISTS (SELECT 1 FROM cancelled) FROM found
"""
CANCEL_BY_ID = text(CANCEL.format(which="id = :id"))
CANCEL_BY_KEY = text(CANCEL.format(which="dedupe_key = :key"))


def cancel_own(
    conn: Connection,
    producer: str,
    reason: str,
    *,
    row_id: int | None = None,
    dedupe_key: str | None = None,
) -> tuple[int, str, bool] | None:
    """Cancel the producer's row unless it is final already: (id, its status before, whether
    this cancelled it), or ``None`` if the producer has no such row."""
    if row_id is not None:
        params: dict[str, Any] = {"producer": producer, "id": row_id, "reason": reason}
        found = conn.execute(CANCEL_BY_ID, params).first()
    else:
        params = {"producer": producer, "key": dedupe_key, "reason": reason}
        found = conn.execute(CANCEL_BY_KEY, params).first()
    return None if found is None else (int(found[0]), str(found[1]), bool(found[2]))


def ready(conn: Connection) -> None:
    """Raises unless the database answers."""
    conn.execute(text("SELECT 1"))
