"""Limits on password guesses, by user name and by client, in the console process's memory.

A user name, and a client, may fail ``FREE`` (5) times; after that each further attempt must
wait ``2 ** (failures - FREE)`` seconds after the last failure: 1, 2, 4, 8, ... up to
``CLIENT_CAP`` (30 s) for a client and ``NAME_CAP`` (5 s) for a name. An attempt made too soon
is refused (HTTP 429 with ``Retry-After``) before its password is looked at, so a refused guess
costs no scrypt. Failures are forgotten ``WINDOW`` (15 minutes) after the last one, and when
the name logs in from that client.

The name's cap is short on purpose: it slows guesses at one account from many clients to one
per 5 s, yet an attacker cannot lock a real admin out with it: from a client that has not been
failing, the right password gets in at most 5 s after the attacker's latest failure. The
attacker's own client waits up to 30 s between guesses.

An attempt counts as a failure from the moment it is let through until its password proves
right, so a burst of concurrent guesses cannot all pass before the first one is counted.

Memory stays bounded: every configured user has a record of its own; names that are no user
(anyone can make one up: they are tracked too, so that a 429 tells no one which names exist)
and clients share at most ``capacity`` records each, the one idle longest dropped first (a
record past its window is worth nothing anyway).
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

FREE = 5
CLIENT_CAP = 30.0
NAME_CAP = 5.0
WINDOW = 15 * 60.0
CAPACITY = 10_000


@dataclass(slots=True)
class _Record:
    failures: int
    last: float


def _delay(failures: int, cap: float) -> float:
    return 0.0 if failures < FREE else min(cap, 2.0 ** (failures - FREE))


class Attempts:
    """Failed logins by user name and by client, and how long the next attempt must wait."""

    def __init__(
        self,
        users: Iterable[str],
        *,
        clock: Callable[[], float] = time.monotonic,
        capacity: int = CAPACITY,
    ) -> None:
        self.clock = clock
        self.capacity = capacity
        self._users = frozenset(users)
        self._known: dict[str, _Record] = {}
        self._names: OrderedDict[str, _Record] = OrderedDict()
        self._clients: OrderedDict[str, _Record] = OrderedDict()
        self._lock = threading.Lock()

    def _store(self, name: str) -> dict[str, _Record]:
        return self._known if name in self._users else self._names

    def _live(self, store: dict[str, _Record], key: str, now: float) -> _Record | None:
        record = store.get(key)
        return record if record is not None and now - record.last <= WINDOW else None

    def _count(self, store: dict[str, _Record], key: str, now: float) -> None:
        record = self._live(store, key, now) or _Record(0, now)
        record.failures += 1
        record.last = now
        store[key] = record
        if isinstance(store, OrderedDict):
            store.move_to_end(key)
            while len(store) > self.capacity:
                store.popitem(last=False)

    def begin(self, name: str, client: str) -> float:
        """0 to go ahead (the attempt counts as failed until ``succeeded``), or the seconds
        the attempt must still wait, nothing counted."""
        with self._lock:
            now = self.clock()
            wait = 0.0
            for store, key, cap in (
                (self._clients, client, CLIENT_CAP),
                (self._store(name), name, NAME_CAP),
            ):
                record = self._live(store, key, now)
                if record is not None:
                    wait = max(wait, record.last + _delay(record.failures, cap) - now)
            if wait > 0:
                return wait
            self._count(self._clients, client, now)
            self._count(self._store(name), name, now)
            return 0.0

    def succeeded(self, name: str, client: str) -> None:
        """The password was right: the name and the client start afresh."""
        with self._lock:
            self._clients.pop(client, None)
            self._store(name).pop(name, None)

    def sizes(self) -> tuple[int, int, int]:
        """Records held: users', other names', clients'."""
        with self._lock:
            return len(self._known), len(self._names), len(self._clients)


def retry_after(wait: float) -> int:
    """A wait as ``Retry-After`` whole seconds, at least 1."""
    return max(1, math.ceil(wait))
