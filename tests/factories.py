"""Notifications rows and settings for tests, written the way the service would meet them.

``Rows.make`` writes a row through the producers' own INSERT (``notifier.db.producers``), so a
test's rows carry the defaults and triggers a producer's do; columns a producer never sets (a
status, attempts, a claim, times in the past) are then set on that row in the same
transaction. ``Rows.raw`` is for the rows no producer should write, on purpose: a payload that
is no JSON object, times at infinity, text a terminal would act on. The fixtures in
``tests/conftest.py`` hand these out as ``make_row``, ``make_rows`` and ``raw_row``, and
``set_env`` (``environment`` here) for the settings read from the environment.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, text

from notifier.db import producers
from notifier.models import Notification
from notifier.settings import Settings, get_settings

#: The fixtures' types, for the tests' signatures.
MakeRow = Callable[..., int]
MakeRows = Callable[..., list[int]]
MakeSettings = Callable[..., Settings]
SetEnv = Callable[..., None]

#: The columns the producers' INSERT writes, by the name it binds each to.
PRODUCER_COLUMNS = {
    "channel": "channel",
    "recipient": "recipient",
    "subject": "subject",
    "body": "body",
    "payload": "payload",
    "dedupe_key": "dedupe_key",
    "max_attempts": "max_attempts",
    "priority": "priority",
    "next_attempt_at": "send_at",
    "expires_at": "expires_at",
    "guard": "guard",
    "template": "template",
    "locale": "locale",
    "category": "category",
    "profile": "profile",
}

#: What a row holds when a test does not say: a row for the null provider, due now.
DEFAULTS: dict[str, Any] = {"channel": "null", "recipient": "x"}

#: A field of ``make_rows`` may be a function of the row's number (1, 2, ...) instead of a value.
Field = Any | Callable[[int], Any]


class Rows:
    """Writes ``notifications`` rows into one test's database."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def make(self, **columns: Any) -> int:
        """One row as a producer enqueues it, then in whatever state ``columns`` add; its id."""
        with self.engine.begin() as conn:
            return write_row(conn, **columns)

    def many(self, n: int, **columns: Field) -> list[int]:
        """``n`` rows like ``make``'s, in one transaction; a callable column is given 1..n."""
        with self.engine.begin() as conn:
            return [
                write_row(conn, **{k: v(i) if callable(v) else v for k, v in columns.items()})
                for i in range(1, n + 1)
            ]

    def raw(self, **columns: Any) -> int:
        """One row of these columns (and ``DEFAULTS``), by a plain INSERT that checks nothing.

        ``payload`` is cast to jsonb from the text given (a dict is dumped first), so a test can
        store JSON no producer would.
        """
        values = {**DEFAULTS, **columns}
        if isinstance(values.get("payload"), Mapping):
            values["payload"] = json.dumps(values["payload"])
        names = ", ".join(values)
        params = ", ".join(
            "CAST(:payload AS jsonb)" if name == "payload" else f":{name}" for name in values
        )
        with self.engine.begin() as conn:
            return int(
                conn.execute(
                    text(f"INSERT INTO notifications ({names}) VALUES ({params}) RETURNING id"),
                    values,
                ).scalar_one()
            )


def write_row(conn: Connection, **columns: Any) -> int:
    """``Rows.make`` on the caller's connection, in its transaction (one the test keeps open,
    or with settings of its own such as ``session_replication_role``); the row's id."""
    given = {**DEFAULTS, **columns}
    payload = given.pop("payload", None)
    values: dict[str, Any] = {bind: None for bind in PRODUCER_COLUMNS.values()}
    values["max_attempts"] = given.pop("max_attempts", 5)
    values["priority"] = given.pop("priority", 0)
    values["payload"] = payload if isinstance(payload, str) else json.dumps(payload or {})
    for column, bind in PRODUCER_COLUMNS.items():
        if column in given:
            values[bind] = given.pop(column)
    row_id, created = producers.enqueue_row(conn, values)
    if not created:
        raise ValueError(f"a row with dedupe key {values['dedupe_key']!r} already exists")
    given = _complete(given)
    if given:  # a state no producer writes: set it on the new row
        assignments = ", ".join(f"{name} = :{name}" for name in given)
        conn.execute(
            text(f"UPDATE notifications SET {assignments} WHERE id = :id"),
            {**given, "id": row_id},
        )
    return row_id


def _complete(state: dict[str, Any]) -> dict[str, Any]:
    """What the schema asks of a row in ``state["status"]``, where the test did not say.

    A sent row has its ``sent_at`` (its ``updated_at``, or now); a processing row a claim and a
    lease of five minutes; a dead row has used its five attempts and says why (``"boom"``).
    """
    status = state.get("status")
    now = datetime.now(UTC)
    extra: dict[str, Any] = {}
    if status == "sent":
        extra["sent_at"] = state.get("updated_at", now)
    elif status == "processing":
        extra = {"claim_token": uuid.uuid4(), "locked_until": now + timedelta(minutes=5)}
    elif status == "dead":
        extra = {"attempts": 5, "last_error": "boom"}
    return {**extra, **{k: v for k, v in state.items() if v is not None or k not in extra}}


@contextmanager
def environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[SetEnv]:
    """Sets ``NOTIFIER_*`` variables for the code that reads ``get_settings()``.

    ``set_env(webhook_timeout=1, guard_http_url=None)`` sets ``NOTIFIER_WEBHOOK_TIMEOUT`` and
    removes ``NOTIFIER_GUARD_HTTP_URL``, then drops the cached settings so the next
    ``get_settings()`` reads them. The test's own ``monkeypatch`` restores the variables (one
    undo for all, whoever set them); on leaving, the cached settings are dropped again.
    """

    def set_env(**values: object) -> None:
        for name, value in values.items():
            variable = f"NOTIFIER_{name.upper()}"
            if value is None:
                monkeypatch.delenv(variable, raising=False)
            elif isinstance(value, bool):
                monkeypatch.setenv(variable, str(value).lower())
            else:
                monkeypatch.setenv(variable, str(value))
        get_settings.cache_clear()

    get_settings.cache_clear()
    try:
        yield set_env
    finally:
        get_settings.cache_clear()


def claimed(channel: str, recipient: str, id: int = 42, **fields: Any) -> Notification:
    """A row as a provider gets it from the dispatcher: claimed, on its first attempt."""
    return Notification(
        id=id,
        channel=channel,
        recipient=recipient,
        attempts=1,
        max_attempts=5,
        claim_token=uuid.uuid4(),
        created_at=datetime.now(UTC),
        **fields,
    )


def ago(delta: timedelta = timedelta(0), /, **parts: float) -> datetime:
    """The time ``delta`` (or ``timedelta(**parts)``) before now: ``ago(days=3)``."""
    return datetime.now(UTC) - delta - timedelta(**parts)


def from_now(**parts: float) -> datetime:
    """The time ``timedelta(**parts)`` after now: ``from_now(hours=1)``."""
    return datetime.now(UTC) + timedelta(**parts)


def finished_campaign(engine: Engine, name: str, channel: str = "email") -> int:
    """A campaign row named ``name``, finished (nothing left to launch or send); its id. Its
    notifications are the test's to write, with ``campaign_id``."""
    with engine.begin() as conn:
        return int(
            conn.execute(
                text(
                    "INSERT INTO campaigns (name, channel, status) VALUES (:name, :channel,"
                    " 'finished') RETURNING id"
                ),
                {"name": name, "channel": channel},
            ).scalar_one()
        )
