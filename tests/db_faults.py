"""Faults made in a test's own database, for real: triggers that slow or refuse its writes."""

from __future__ import annotations

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
