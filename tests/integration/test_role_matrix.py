"""The role matrix of docs/database-roles.md, cell by cell, against real LOGIN users.

Each case logs in as a new LOGIN user in one group role, as a deployment would
(docs/roles.sql), does one thing and checks that it took effect or was refused: ``permission
denied``, or row-level security leaving the row alone. The two suppression cells that change
for producers with migration 0021 (lifting an opt-out, deleting any suppression) are not here.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import Engine, text

from tests.roles import Logins

#: One statement per action, run by the login; ``{own}``, ``{other}`` and ``{unowned}`` are a
#: pending row of the login's own, one of another producer, and one written before 0020.
ACTIONS = {
    "insert rows": "INSERT INTO notifications (channel, recipient) VALUES ('null', 'x')",
    "cancel own rows": "UPDATE notifications SET status = 'cancelled', updated_at = now(),"
    " locked_until = NULL, last_error = 'no' WHERE id = {own} AND status = 'pending'",
    "cancel others' rows": "UPDATE notifications SET status = 'cancelled' WHERE id = {other}",
    "cancel unowned rows": "UPDATE notifications SET status = 'cancelled' WHERE id = {unowned}",
    "read id, key, status": "SELECT id, dedupe_key, status, delivery_status FROM notifications",
    "read rows": "SELECT recipient, subject, body, payload, producer FROM notifications",
    "record outcomes": "UPDATE notifications SET status = 'sent', sent_at = now() WHERE id = {own}",
    "delete rows": "DELETE FROM notifications WHERE id = {unowned}",
    "add suppressions": "INSERT INTO suppressions (channel, recipient, reason)"
    " VALUES ('email', 'new@example.com', 'opted out')",
    "delete any suppression": "DELETE FROM suppressions WHERE recipient = 'old@example.com'",
    "read attempts": "SELECT * FROM notification_attempts",
    "write attempts": "INSERT INTO notification_attempts"
    " (notification_id, attempt, worker, channel, outcome) VALUES ({own}, 1, 'w', 'null', 'sent')",
    "delete attempts": "DELETE FROM notification_attempts WHERE notification_id = {unowned}",
    "read the claim's queue": "SELECT * FROM notification_queue",
    "take from the claim's queue": "DELETE FROM notification_queue WHERE id = {unowned}",
    "read templates": "SELECT * FROM templates",
    "write templates": "INSERT INTO templates (name, channel, locale, body)"
    " VALUES ('t', 'null', 'en', 'x')",
    "read campaigns": "SELECT * FROM campaigns",
    "write campaigns": "INSERT INTO campaigns (name, channel, body) VALUES ('c', 'null', 'x')",
    "mark a campaign finished": "UPDATE campaigns SET status = 'finished', updated_at = now()"
    " WHERE name = 'spring'",
    "read status events": "SELECT * FROM status_events",
    "update status events": "UPDATE status_events SET attempts = 1"
    " WHERE notification_id = {unowned}",
    "delete status events": "DELETE FROM status_events WHERE notification_id = {unowned}",
    "switch the status webhook": "SELECT notifier_status_webhook(ARRAY['sent'])",
    "run an audience query": "SELECT * FROM notifier_audience_rows('SELECT ''a'' AS recipient')",
    "change the schema": "CREATE TABLE mine (id int)",
}

_ = False
Y = True
#: action: (producer, worker, operator, audience, events endpoint)
MATRIX = {
    "insert rows": (Y, _, Y, _, _),
    "cancel own rows": (Y, Y, Y, _, Y),
    "cancel others' rows": (_, Y, Y, _, Y),
    "cancel unowned rows": (Y, Y, Y, _, Y),
    "read id, key, status": (Y, Y, Y, _, Y),
    "read rows": (_, Y, Y, _, Y),
    "record outcomes": (_, Y, Y, _, Y),
    "delete rows": (_, Y, Y, _, Y),
    "add suppressions": (Y, Y, Y, _, Y),
    "delete any suppression": (None, _, Y, _, _),
    "read attempts": (_, Y, Y, _, Y),
    "write attempts": (_, Y, Y, _, Y),
    "delete attempts": (_, Y, Y, _, Y),
    "read the claim's queue": (_, Y, _, _, Y),
    "take from the claim's queue": (_, Y, _, _, Y),
    "read templates": (_, Y, Y, _, Y),
    "write templates": (_, _, Y, _, _),
    "read campaigns": (_, Y, Y, _, Y),
    "write campaigns": (_, _, Y, _, _),
    "mark a campaign finished": (_, Y, Y, _, Y),
    "read status events": (_, Y, Y, _, Y),
    "update status events": (_, Y, Y, _, Y),
    "delete status events": (_, Y, Y, _, Y),
    "switch the status webhook": (_, Y, _, _, Y),
    "run an audience query": (_, _, Y, Y, _),
    "change the schema": (_, _, _, _, _),
}

#: The group role of each column; ``notifier events`` runs as a worker login (migration 0014).
GROUPS = {
    "producer": "notifier_producer",
    "worker": "notifier_worker",
    "operator": "notifier_operator",
    "audience": "notifier_audience",
    "events endpoint": "notifier_worker",
}

CELLS = [
    pytest.param(role, action, allowed, id=f"{role}: {action}")
    for action, row in MATRIX.items()
    for role, allowed in zip(GROUPS, row, strict=True)
    if allowed is not None
]

SETUP = """
    INSERT INTO notifications (id, channel, recipient, producer) OVERRIDING SYSTEM VALUE VALUES
        (1, 'null', 'x', :user), (2, 'null', 'x', 'someone else'), (3, 'null', 'x', NULL);
    SELECT setval(pg_get_serial_sequence('notifications', 'id'), 3);
    INSERT INTO suppressions (channel, recipient, reason)
        VALUES ('email', 'old@example.com', 'opted out');
    INSERT INTO notification_attempts (notification_id, attempt, worker, channel, outcome)
        VALUES (3, 1, 'w', 'null', 'dead');
    INSERT INTO status_events (notification_id, kind, state, channel, occurred_at)
        VALUES (3, 'status', 'dead', 'null', now());
    INSERT INTO templates (name, channel, locale, body) VALUES ('welcome', 'null', 'en', 'hi');
    INSERT INTO campaigns (name, channel, body, status) VALUES ('spring', 'null', 'hi', 'running');
"""


@pytest.fixture
def logins(engine: Engine, database_url: str) -> Iterator[Logins]:
    made = Logins(engine, database_url)
    yield made
    made.drop()


def _took_effect(conn: psycopg.Connection[tuple[object, ...]], statement: str) -> bool:
    """Whether the statement ran and, if it changes rows, changed one; False if refused."""
    try:
        cursor = conn.execute(statement)
    except psycopg.errors.InsufficientPrivilege:
        conn.rollback()
        return False
    if statement.startswith(("UPDATE", "DELETE")):
        return cursor.rowcount == 1
    return True


def test_every_action_has_a_statement() -> None:
    assert set(MATRIX) == set(ACTIONS)


@pytest.mark.parametrize(("role", "action", "allowed"), CELLS)
def test_the_role_matrix(
    engine: Engine, logins: Logins, role: str, action: str, allowed: bool
) -> None:
    user = logins.make(GROUPS[role])
    with engine.begin() as conn:
        for statement in SETUP.split(";"):
            if statement.strip():
                conn.execute(text(statement), {"user": user})
    statement = ACTIONS[action].format(own=1, other=2, unowned=3)
    with logins.connect(user) as conn:
        assert _took_effect(conn, statement) is allowed
        conn.commit()
