"""What the HTTP API does, without HTTP: a key's checks, and its rows written, read and cancelled.

Synchronous (the database layer is): ``app.py`` runs each call in Starlette's thread pool.
Every refusal is an ``ApiError`` naming the field and the fix; nothing is written for one.

Idempotency: a request with an ``Idempotency-Key`` writes its row with ``dedupe_key``
``<key name>:<Idempotency-Key>`` and keeps the request's hash beside it (``request_hash``), in
one transaction that holds the key (an advisory lock) while it runs: a repeat with the same
body is answered as the first was (``replayed``), one with another body is refused (422), one
that arrives while the first is still under way is told to come back (409, ``Retry-After``).
The row's key never expires, as the table promises.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, NamedTuple

import redis
from sqlalchemy import Connection, Engine

from notifier.api import batch, bodies, keys
from notifier.api.batch import Created
from notifier.api.bodies import ApiError
from notifier.db import api as api_db
from notifier.db.api import KeyRow
from notifier.settings import Settings

log = logging.getLogger(__name__)

RATE_KEY = "notifier:api:rate:{key}:{second}"
#: A key's requests in a second, counted, and the count kept for two seconds, in one command:
#: a pipeline's MULTI, INCR, EXPIRE and EXEC cost the API's process about a tenth of its CPU a
#: request (py-spy, 200 requests a second).
COUNT = """
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('EXPIRE', KEYS[1], 2) end
return n
"""


class Presented(NamedTuple):
    """A key as a request presents it, in a key's form: not yet found to be one."""

    key: str
    prefix: str


class Service:
    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        counter: redis.Redis | None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.counter = counter
        self.clock = clock
        self._count = counter.register_script(COUNT) if counter is not None else None
        self._slots: int | None = None  # batch slots, read from the server at the first batch
        # Connections in autocommit: each statement its own transaction, with no BEGIN and
        # COMMIT (or ROLLBACK) around it. A key is read on one, and a single request is written
        # on one (``create``).
        self.autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")

    # -- who asks ---------------------------------------------------------------------------

    @staticmethod
    def presented(authorization: str | None) -> Presented:
        """The key an ``Authorization: Bearer <key>`` header presents, if it has a key's form;
        401 otherwise, before anything is asked of the database."""
        scheme, _, given = (authorization or "").partition(" ")
        key = given.strip()
        prefix = keys.prefix_of(key) if scheme.lower() == "bearer" else None
        if prefix is None:
            raise ApiError(401, "unauthorized", "send your API key as Authorization: Bearer nk_...")
        return Presented(key, prefix)

    def authenticate(self, presented: Presented, conn: Connection | None = None) -> KeyRow:
        """The live key ``presented``; 401 if there is none. Read on ``conn`` when given (a
        write's: one pool checkout, and its ping, fewer), else on a connection of its own."""
        if conn is not None:
            row = api_db.live_key(conn, presented.prefix)
        else:
            with self.autocommit.connect() as own:
                row = api_db.live_key(own, presented.prefix)
        if row is None or not keys.matches(presented.key, row):
            raise ApiError(401, "unauthorized", "this API key is not valid (or was revoked)")
        return row

    def admit(self, key: KeyRow) -> None:
        """Count the request against its key's rate, shared by every API process; 429 past it.
        Without Redis the request goes on (logged): producers' rows are not lost to it."""
        if self._count is None:
            return
        limit = key.per_second or self.settings.api_rate_per_second
        second = int(self.clock().timestamp())
        name = RATE_KEY.format(key=key.id, second=second)
        try:
            count = int(self._count(keys=[name]))
        except redis.RedisError as exc:
            log.warning("API rate limit not counted, Redis unavailable: %s", exc)
            return
        if count > limit:
            raise ApiError(
                429,
                "rate_limited",
                f"over {limit} requests a second for this key: slow down",
                retry_after=1,
            )

    # -- writing ----------------------------------------------------------------------------

    def create(
        self, conn: Connection, key: KeyRow, doc: Any, idempotency_key: str | None
    ) -> Created:
        """One notification, checked and written on ``conn``, a connection of ``autocommit``:
        its row in one statement (``batch.write_alone``); a refusal raised from here wrote
        nothing."""
        now = self.clock()
        one = batch.item(key, doc, idempotency_key, lambda fields: self._checked(key, now, fields))
        outcome = batch.write_alone(conn, key, one)
        if isinstance(outcome, ApiError):
            raise outcome
        return outcome

    def create_many(self, key: KeyRow, doc: Any) -> list[dict[str, Any]]:
        """Each item written or refused on its own, in one transaction (``batch``)."""
        listed = doc.get("notifications") if isinstance(doc, dict) else None
        limit = self.settings.api_max_batch
        if (
            not isinstance(listed, list)
            or not 0 < len(listed) <= limit
            or set(doc) != {"notifications"}
        ):
            raise ApiError(
                422,
                "invalid_body",
                f'send {{"notifications": [...]}} with 1 to {limit} notifications',
                "notifications",
            )
        keys.must_write(key)
        check = functools.partial(self._checked, key, self.clock())  # the request's time
        items = [self._item(key, given, check) for given in listed]
        with self.engine.begin() as conn:
            if self._slots is None:
                self._slots = api_db.batch_slots(conn, self.settings.api_max_batch)
            outcomes = batch.write(conn, key, items, self._slots)
        return [
            {"index": index, "status": "refused", **outcome.document()}
            if isinstance(outcome, ApiError)
            else {
                "index": index,
                "status": "replayed" if outcome.replayed else "created",
                **outcome.document(),
            }
            for index, outcome in enumerate(outcomes)
        ]

    def _item(self, key: KeyRow, given: Any, check: Callable[[Any], Any]) -> batch.Item | ApiError:
        """One batch item, checked by ``check``; the refusal if it is refused."""
        try:
            if isinstance(given, dict):
                named = given.get("idempotency_key")
                fields = dict(given)
                fields.pop("idempotency_key", None)
            else:
                named, fields = None, given
            idem = bodies.idempotency_key(
                named if isinstance(named, str) or named is None else str(named),
                "idempotency_key",
            )
            return batch.item(key, fields, idem, check)
        except ApiError as exc:
            return exc

    def _checked(self, key: KeyRow, now: datetime, doc: Any) -> dict[str, Any]:
        keys.must_write(key)
        args = bodies.notification(doc, now=now)
        for field, allowed in (("channel", key.channels), ("category", key.categories)):
            if allowed is not None and args[field] not in allowed:
                raise ApiError(
                    403, "out_of_scope", f"this key may write {field} {allowed} only", field
                )
        return args

    # -- reading and cancelling -------------------------------------------------------------

    def read(self, key: KeyRow, *, row_id: int | None = None, idem: str | None = None) -> Any:
        dedupe = None if idem is None else f"{key.name}:{idem}"
        with self.engine.connect() as conn:
            row = api_db.own_row(conn, key.name, row_id=row_id, dedupe_key=dedupe)
        if row is None:
            raise ApiError(404, "not_found", "this key wrote no such notification")
        return _view(row, key.name)

    def cancel(self, key: KeyRow, *, row_id: int | None = None, idem: str | None = None) -> Any:
        keys.must_write(key)
        dedupe = None if idem is None else f"{key.name}:{idem}"
        with self.engine.begin() as conn:
            found = api_db.cancel_own(
                conn, key.name, "cancelled through the API", row_id=row_id, dedupe_key=dedupe
            )
        if found is None:
            raise ApiError(404, "not_found", "this key wrote no such notification")
        row_id, status, cancelled = found
        if not cancelled:
            raise ApiError(409, "final", f"notification {row_id} is {status} already")
        return {"id": row_id, "status": "cancelled"}

    def ready(self) -> None:
        """Raises unless the database (and Redis, when counting) answer."""
        with self.engine.connect() as conn:
            api_db.ready(conn)
        if self.counter is not None:
            self.counter.ping()


def _view(row: dict[str, Any], producer: str) -> dict[str, Any]:
    """A row as the API shows it: times in RFC 3339, the key as the producer gave it."""
    dedupe = row.pop("dedupe_key")
    prefix = f"{producer}:"
    row["idempotency_key"] = (
        dedupe[len(prefix) :] if isinstance(dedupe, str) and dedupe.startswith(prefix) else None
    )
    return {
        name: _json(value)
        if name != "history"
        else [{k: _json(v) for k, v in h.items()} for h in value]
        for name, value in row.items()
    }


def _json(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value
