"""Frequency caps: at most N messages of a category to one person in a window, shared by every
worker process on every machine, kept in Redis.

``NOTIFIER_FREQUENCY_CAPS`` (``marketing=1/d,3/7d;digest=2/d:wait``) caps the categories it
names. A person is the row's profile, or for a row without one its channel and recipient. Right
before a batch's rows are sent, each capped row takes a place in its person's log for the
category (a sorted set of row ids scored by the Redis server's time), atomically across every
window, in one Lua script: granted when every window has room, else refused with the time the
oldest counted send leaves the window. A row given a place and then not sent (a retry, a
failure, a cancel) gives it back when its outcome is recorded, so the log counts what was sent;
a worker that dies between the two leaves the place taken until the window passes (one message
fewer, never one more). A refused row is cancelled, or with ``:wait`` held (``held``, no attempt
used) until the window allows it, as the category says.

Key layout: ``notifier:cap:{category}:{sha256 of the person}``; the person's id or address never
becomes part of a key as written. If Redis cannot be reached, capped rows are held for a minute
and nothing capped is sent (fail closed); the rest of the batch goes out.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import redis

from notifier.delivery.outcomes import Cancelled, Held, Result
from notifier.models import Notification
from notifier.specs import Cap

log = logging.getLogger(__name__)

#: How long capped rows wait when Redis cannot tell whether they may go.
UNKNOWN_HOLD = timedelta(seconds=60)

# KEYS[1]: the person's log for the category. ARGV: the row id, then per window its limit and
# period in ms. Returns {1, 0} when the row has its place (or had it already), else {0, wait}:
# the ms until the oldest send the fullest window counts leaves it.
TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local key, member = KEYS[1], ARGV[1]
if redis.call('ZSCORE', key, member) then
  return {1, '0'}
end
local longest = 0
for i = 2, #ARGV, 2 do
  longest = math.max(longest, tonumber(ARGV[i + 1]))
end
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - longest)
local wait = 0
for i = 2, #ARGV, 2 do
  local limit, period = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  local counted = redis.call('ZRANGEBYSCORE', key, now - period, '+inf', 'WITHSCORES')
  local n = #counted / 2
  if n >= limit then
    local oldest = tonumber(counted[2 * (n - limit) + 2])
    wait = math.max(wait, oldest + period - now + 1)
  end
end
if wait > 0 then
  return {0, tostring(wait)}
end
redis.call('ZADD', key, now, member)
redis.call('PEXPIRE', key, longest)
return {1, '0'}
"""


@dataclass(frozen=True, slots=True)
class Place:
    """Where a capped row's send is counted: its person's log for its category."""

    key: str
    member: str


class FrequencyCaps:
    """The caps of one deployment, over one Redis (see the module docstring)."""

    def __init__(self, client: redis.Redis | None, caps: Mapping[str, Cap]) -> None:
        self._client = client
        self._caps = dict(caps)
        self._take = client.register_script(TAKE) if client is not None and caps else None

    def __bool__(self) -> bool:
        return self._take is not None

    def place(self, n: Notification) -> Place | None:
        """Where ``n`` is counted, or ``None`` if its category is not capped."""
        if n.category is None or n.category not in self._caps:
            return None
        person = (
            f"profile:{n.profile.id}" if n.profile is not None else f"{n.channel}:{n.recipient}"
        )
        digest = hashlib.sha256(person.encode()).hexdigest()
        return Place(f"notifier:cap:{n.category}:{digest}", str(n.id))

    def admit(
        self, rows: Sequence[Notification], now: datetime
    ) -> tuple[list[Notification], dict[int, Result]]:
        """The rows that may be sent now (each capped one with its place taken), and the
        results of those over their person's cap."""
        capped = [(n, place) for n in rows if (place := self.place(n)) is not None]
        if not capped or self._take is None or self._client is None:
            return list(rows), {}
        results: dict[int, Result] = {}
        try:
            pipe = self._client.pipeline(transaction=False)
            for n, place in capped:
                cap = self._caps[n.category or ""]
                self._take(keys=[place.key], args=[place.member, *cap.args()], client=pipe)
            answers = pipe.execute()
        except redis.RedisError as exc:
            log.warning("frequency caps cannot be checked, capped rows wait: %s", exc)
            why = f"frequency caps cannot be checked (Redis: {type(exc).__name__}); tried again"
            return self._without(rows, capped, Held(now + UNKNOWN_HOLD, why))
        for (n, _), (granted, wait_ms) in zip(capped, answers, strict=True):
            if int(granted):
                continue
            cap = self._caps[n.category or ""]
            until = now + timedelta(milliseconds=float(wait_ms))
            said = f"frequency cap: {n.category} at most {cap.spelling} to one person, reached"
            results[n.id] = (
                Held(until, f"{said}; held until {until.astimezone(UTC):%Y-%m-%d %H:%M} UTC")
                if cap.wait
                else Cancelled(said)
            )
        return [n for n in rows if n.id not in results], results

    def release(self, rows: Sequence[Notification]) -> None:
        """Give back the places of capped rows that were not sent. A Redis that cannot be
        reached keeps them taken until their window passes: fewer sends, never more."""
        places = [place for n in rows if (place := self.place(n)) is not None]
        if not places or self._client is None:
            return
        try:
            pipe = self._client.pipeline(transaction=False)
            for place in places:
                pipe.zrem(place.key, place.member)
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("could not give back %d frequency-cap places: %s", len(places), exc)

    @staticmethod
    def _without(
        rows: Sequence[Notification],
        capped: Sequence[tuple[Notification, Place]],
        result: Result,
    ) -> tuple[list[Notification], dict[int, Result]]:
        held = {n.id: result for n, _ in capped}
        return [n for n in rows if n.id not in held], held
