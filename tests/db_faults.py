"""Faults made in a test's own database, for real: triggers that slow, hold or refuse its
writes, and how a test sees a session wait on a lock before it goes on."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
from sqlalchemy import Engine, text


def slow_inserts(engine: Engine, seconds: float) -> None:
    """From now on every row inserted into ``notifications`` takes ``seconds`` to write."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "CREATE FUNCTION slow_insert() RETURNS trigger LANGUAGE plpgsql AS $$"
                f" BEGIN PERFORM pg_sleep({float(seconds)}); RETURN NEW; END $$;"
                " CREATE TRIGGER slow_insert BEFORE INSERT ON notifications"
                " FOR EACH ROW EXECUTE FUNCTION slow_insert()"
            )
        )


def slow_insert_statements(engine: Engine, seconds: float) -> None:
    """From now on every INSERT into ``notifications`` takes ``seconds`` more, however many
    rows it writes (what its transaction holds is held that much longer)."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "CREATE FUNCTION slow_insert_statement() RETURNS trigger LANGUAGE plpgsql AS $$"
                f" BEGIN PERFORM pg_sleep({float(seconds)}); RETURN NULL; END $$;"
                " CREATE TRIGGER slow_insert_statement BEFORE INSERT ON notifications"
                " FOR EACH STATEMENT EXECUTE FUNCTION slow_insert_statement()"
            )
        )


def hold_updates(engine: Engine, lock: int) -> None:
    """From now on an UPDATE of ``notifications`` in a session that sets ``test.hold`` to
    ``on`` waits, once its statement's snapshot is taken and before it reads a row, for the
    advisory lock ``lock`` (a statement trigger runs there)."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "CREATE FUNCTION hold_update() RETURNS trigger LANGUAGE plpgsql AS $$"
                " BEGIN IF current_setting('test.hold', true) = 'on' THEN"
                f" PERFORM pg_advisory_xact_lock({int(lock)}); END IF; RETURN NULL; END $$;"
                " CREATE TRIGGER hold_update BEFORE UPDATE ON notifications"
                " FOR EACH STATEMENT EXECUTE FUNCTION hold_update()"
            )
        )


def lock_waiters(conn: psycopg.Connection[Any], statement: str = "%", lock: str = "%") -> int:
    """Sessions of this database waiting for a lock whose kind is LIKE ``lock`` (``advisory``,
    ``tuple``, ...), running a statement LIKE ``statement``."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        " AND wait_event LIKE %s AND query LIKE %s",
        (lock, statement),
    ).fetchone()
    assert row is not None
    return int(row[0])


def wait_until(predicate: Callable[[], bool], what: str, timeout: float) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
