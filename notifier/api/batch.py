"""Writing requests' notifications: one, or a batch, in a handful of statements whatever its size.

Each item is checked first (its JSON, the key's scope, the worker's own checks:
``notifier.client.checked_row``, which reads the profile and template it names in the caller's
transaction), and refused on its own; an item repeating an earlier item's key is not checked
again. Then, in that transaction:

1. the items' idempotency keys are held (advisory locks, tried, never waited for: a key that
   another request holds answers its item 409 ``in_progress``), and the transaction's
   producer named (the key's name, which its rows carry), in one statement; a request of many
   keys first waits for one of a few batch slots, so that batches never fill the server's
   lock table (``notifier.db.api.SLOTLESS_KEYS``);
2. the items are inserted, each keyed one with its request's hash, in one statement (a
   batch's rows copied into a staging table first: ``notifier.db.api.write_requests``), but
   for those whose key was used before;
3. for those, and for refused items with a key, what their key was first asked with is read
   (on its row, or in ``api_requests`` once the row is gone), in one statement, only if there
   are any: an item whose key was used with the same request is a replay, with another
   request refused; a key that a SQL producer wrote as a ``dedupe_key`` itself is refused
   ``key_in_use``.

Should the one INSERT fail after all (a constraint the checks did not foresee), it is undone to
a savepoint and the items are written one by one, each in a savepoint of its own, so that only
the bad item is refused. A single request (``POST /v1/notifications``) is checked and written
by ``write_alone``: its key held and its row written in one statement, which is its own
transaction. A database that fails to run it (a lost connection, a statement past
``NOTIFIER_API_STATEMENT_TIMEOUT_SECONDS``) refuses nothing: the request is answered 503.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from notifier import client
from notifier.api import bodies
from notifier.api.bodies import ApiError
from notifier.db import api as api_db
from notifier.db.api import KeyRow

IN_PROGRESS = ApiError(
    409,
    "in_progress",
    "a request with this idempotency key is under way: try again in a moment",
    "Idempotency-Key",
    retry_after=1,
)
REUSED = ApiError(
    422,
    "idempotency_key_reused",
    "this idempotency key was used for another request: give each new notification a key of"
    " its own",
    "Idempotency-Key",
)
IN_USE = ApiError(
    409,
    "key_in_use",
    "a notification with this key was written without the API: use another key",
    "Idempotency-Key",
)


@dataclass(frozen=True, slots=True)
class Created:
    """A row written (or found again, ``replayed``) for one item."""

    id: int
    idempotency_key: str | None
    replayed: bool

    def document(self) -> dict[str, Any]:
        return {"id": self.id, "idempotency_key": self.idempotency_key, "replayed": self.replayed}


#: What became of one item.
Outcome = Created | ApiError


@dataclass(slots=True)
class Item:
    """One notification of a request: its fields, as checked (``args``), and its key."""

    args: dict[str, Any]
    fields: Any
    idempotency_key: str | None
    dedupe_key: str | None
    digest: bytes
    values: dict[str, Any] | None = None


def item(
    key: KeyRow, fields: Any, idempotency_key: str | None, check: Callable[[Any], Any]
) -> Item:
    """An item checked for ``key`` (``check`` raises ``ApiError``)."""
    dedupe = None if idempotency_key is None else f"{key.name}:{idempotency_key}"
    return Item(check(fields), fields, idempotency_key, dedupe, bodies.request_hash(fields))


def write(
    conn: Connection,
    key: KeyRow,
    items: Sequence[Item | ApiError],
    slots: int = 1,
) -> list[Outcome]:
    """Each item's outcome, in order (an ``ApiError`` given stays that item's refusal), its row
    written as ``key``'s producer's. A request of many keys first takes one of ``slots`` batch
    slots (``api.take_batch_slot``)."""
    outcomes: list[Outcome | None] = [i if isinstance(i, ApiError) else None for i in items]
    earlier: dict[str, int] = {}  # a key's first item in this request
    checked: list[int] = []
    for index, one in enumerate(items):
        if not isinstance(one, Item):
            continue
        dedupe = one.dedupe_key
        if dedupe is not None:
            if dedupe in earlier:
                continue  # decided once the first is written
            earlier[dedupe] = index
        try:
            one.values = client.checked_row(conn, key=dedupe, **one.args)
        except ValueError as exc:
            outcomes[index] = ApiError(422, "invalid_notification", str(exc))
            continue
        checked.append(index)
    # The slot and the keys are held for the write alone: the checks, most of a batch's time,
    # run while other requests write (four batches under way had waited, checks and all, for
    # three slots).
    if len(earlier) > api_db.SLOTLESS_KEYS:
        api_db.take_batch_slot(conn, slots)
    held = api_db.open_request(conn, key.name, sorted(earlier))
    for index, one in enumerate(items):
        if isinstance(one, Item) and one.dedupe_key is not None and one.dedupe_key not in held:
            outcomes[index] = IN_PROGRESS
    earlier = {dedupe: index for dedupe, index in earlier.items() if dedupe in held}
    fresh = [index for index in checked if outcomes[index] is None]
    _insert(conn, key, items, fresh, outcomes)
    unsure = [i for i in earlier.values() if not isinstance(outcomes[i], Created)]
    _replays(conn, key.name, items, unsure, outcomes)
    for index, one in enumerate(items):  # an item repeating an earlier item's key
        if isinstance(one, Item) and outcomes[index] is None:
            outcomes[index] = _repeat(items[earlier[one.dedupe_key or ""]], one, outcomes, earlier)
    return [o if o is not None else IN_PROGRESS for o in outcomes]


def write_alone(conn: Connection, key: KeyRow, one: Item) -> Outcome:
    """A single request's item: checked, then written in one statement of its own (``conn`` in
    autocommit: ``api.write_alone``), or found to be a replay of its key's first request. A
    refusal of the database's is the item's (422), with nothing written."""
    try:
        one.values = client.checked_row(conn, key=one.dedupe_key, **one.args)
    except ValueError as exc:
        return ApiError(422, "invalid_notification", str(exc))
    body_hash = one.digest if one.dedupe_key else None
    try:
        held, row_id = api_db.write_alone(conn, key.name, one.values, body_hash)
    except DBAPIError as exc:
        if _outage(exc):
            raise
        return _refused(exc)
    if not held:
        return IN_PROGRESS
    if row_id is not None:
        return Created(row_id, one.idempotency_key, False)
    outcomes: list[Outcome | None] = [None]
    _replays(conn, key.name, [one], [0], outcomes)
    return outcomes[0] or IN_PROGRESS


def _replays(
    conn: Connection,
    producer: str,
    items: Sequence[Item | ApiError],
    unsure: list[int],
    outcomes: list[Outcome | None],
) -> None:
    """The outcome of each keyed item of ``unsure``, not written (or refused), as what its key
    was first asked with decides it: a replay of that request's row for the same notification,
    a refusal for another; a key never asked for before is a SQL producer's (``key_in_use``) or
    stays refused. Read only for these: a new key's request is written, not looked for."""
    if not unsure:
        return
    firsts = api_db.first_requests(conn, producer, sorted({_key_of(items[i]) for i in unsure}))
    for index in unsure:
        one = items[index]
        assert isinstance(one, Item)
        found = firsts.get(_key_of(one))
        if found is not None:
            digest, row_id = found
            same = digest == one.digest
            outcomes[index] = Created(row_id, one.idempotency_key, True) if same else REUSED
        elif outcomes[index] is None:
            outcomes[index] = IN_USE


def _key_of(one: Item | ApiError) -> str:
    return one.dedupe_key or "" if isinstance(one, Item) else ""


def _repeat(
    first: Item | ApiError, one: Item, outcomes: list[Outcome | None], earlier: dict[str, int]
) -> Outcome:
    """What an item gets that repeats the key of an earlier item of its request: a replay of
    that one's row for the same notification, a refusal for another, or that one's refusal."""
    made = outcomes[earlier[one.dedupe_key or ""]]
    if not isinstance(made, Created):
        return made if made is not None else IN_PROGRESS
    if isinstance(first, Item) and first.digest == one.digest:
        return Created(made.id, one.idempotency_key, True)
    return REUSED


def _insert(
    conn: Connection,
    key: KeyRow,
    items: Sequence[Item | ApiError],
    fresh: list[int],
    outcomes: list[Outcome | None],
) -> None:
    if not fresh:
        return
    chosen = [items[i] for i in fresh]
    made = [(one, one.values) for one in chosen if isinstance(one, Item) and one.values is not None]
    rows = [values for _, values in made]
    hashes = [one.digest if one.dedupe_key else None for one, _ in made]  # keyless: none kept
    try:
        with conn.begin_nested():
            written = api_db.write_requests(conn, rows, hashes)
    except DBAPIError as exc:
        if _outage(exc):
            raise
        for index in fresh:
            outcomes[index] = _alone(conn, key, items[index])
        return
    by_key = {dedupe: row_id for row_id, dedupe in written if dedupe is not None}
    keyless = iter(row_id for row_id, dedupe in written if dedupe is None)
    for index, one in zip(fresh, chosen, strict=True):
        assert isinstance(one, Item)
        if one.dedupe_key is None:
            outcomes[index] = Created(next(keyless), None, False)
        elif one.dedupe_key in by_key:
            row_id = by_key[one.dedupe_key]
            outcomes[index] = Created(row_id, one.idempotency_key, False)
        # else: its key was used before (``_replays`` tells how)


def _alone(conn: Connection, key: KeyRow, one: Item | ApiError) -> Outcome | None:
    """One item written in a savepoint of its own: its row, why the database refused it, or
    ``None`` if its key was used before."""
    if not isinstance(one, Item) or one.values is None:
        return one if isinstance(one, ApiError) else IN_PROGRESS
    try:
        with conn.begin_nested():
            hashes = [one.digest if one.dedupe_key else None]
            written = api_db.write_requests(conn, [one.values], hashes)
            if not written:
                return None
            row_id = written[0][0]
    except DBAPIError as exc:
        if _outage(exc):
            raise
        return _refused(exc)
    return Created(row_id, one.idempotency_key, False)


def _refused(exc: DBAPIError) -> ApiError:
    """An item's refusal for the database's error writing it."""
    reason = str(exc.orig).splitlines()[0] if exc.orig is not None else type(exc).__name__
    return ApiError(422, "invalid_notification", f"the database refused it: {reason}")


def _outage(exc: DBAPIError) -> bool:
    """An error of the database's running (a lost connection, a statement past its timeout),
    not of what was written: the request is answered 503, nothing refused for it."""
    return isinstance(exc, OperationalError | InterfaceError) or exc.connection_invalidated
