"""Per-provider rate limits, shared by every worker process on every machine, kept in Redis.

A provider may have several windows (``100/s`` and ``20000/h``); each is a token bucket that
refills at ``limit / period`` and holds at most its burst. A batch asks for all its rows of a
provider at once and is granted what every window can give right now, atomically, in one Lua
script that reads the time from the Redis server (workers' clocks do not matter). Rows beyond the
grant go back to ``pending`` for the time the script says, without using up an attempt.

A provider may also warm up (``NOTIFIER_RATE_WARMUP``): one more window whose limit is the
day's (``specs.Warmup``), the day read from the limiter's clock in UTC. Its bucket is keyed by
the warm-up's whole spelling, so it carries its tokens over midnight and only its refill rate and
burst grow. Workers whose clocks differ by a second disagree about the day for that second only.

Key layout: ``notifier:rate:{provider}:{window}`` - a hash with ``tokens`` (float, may go
negative after a provider's 429) and ``ts`` (the server time of the last update, ms), expiring
once the bucket would be full again. ``window`` is the window's spelling, e.g. ``100/s``, or a
warm-up's, e.g. ``50/s x2/d to 2000/s from 2026-12-01``.

A 429 from something without windows of its own - one webhook receiver, ``webhook:host:port`` -
holds back that alone: ``notifier:hold:{scope}``, a string that expires when the hold ends.

If Redis cannot be reached the limiter raises, and the dispatcher sends nothing (fail closed).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any, Protocol

import redis

from notifier.specs import Warmup, Window

#: Longest a receiver's 429 holds it back, whatever its ``Retry-After`` says.
MAX_HOLD_SECONDS = 3600.0


# KEYS: one bucket per window of the provider.
# ARGV: requested count, then per window its refill rate (tokens per ms) and its capacity.
# Returns {granted, wait_ms as a string}: wait_ms is how long until every window can give at
# least one more token (0 when all was granted).
ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local want = tonumber(ARGV[1])
local grant = want
local avail = {}
for i, key in ipairs(KEYS) do
  local rate, cap = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local state = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens = tonumber(state[1]) or cap
  local ts = tonumber(state[2]) or now
  tokens = math.min(cap, tokens + math.max(0, now - ts) * rate)
  avail[i] = tokens
  grant = math.min(grant, math.max(0, math.floor(tokens)))
end
local wait = 0
for i, key in ipairs(KEYS) do
  local rate, cap = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local left = avail[i] - grant
  redis.call('HSET', key, 'tokens', left, 'ts', now)
  redis.call('PEXPIRE', key, math.ceil((cap - left) / rate) + 1000)
  if grant < want and left < 1 then
    wait = math.max(wait, (1 - left) / rate)
  end
end
return {grant, tostring(wait)}
"""

# KEYS: the provider's buckets. ARGV: seconds to block, then per window rate and capacity.
# Empties every bucket and takes the tokens the blocked time would refill, so no worker sends
# to the provider until it has passed (a provider's 429 with Retry-After).
BLOCK = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local ms = tonumber(ARGV[1]) * 1000
for i, key in ipairs(KEYS) do
  local rate, cap = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  redis.call('HSET', key, 'tokens', -ms * rate, 'ts', now)
  redis.call('PEXPIRE', key, math.ceil((cap + ms * rate) / rate) + 1000)
end
return 1
"""


class Limiter(Protocol):
    """What the dispatcher asks of rate limits: ``RateLimiter``, or ``NoLimits``."""

    def acquire(self, provider: str, count: int) -> tuple[int, float]: ...

    def block(self, provider: str, seconds: float) -> None: ...

    def held(self, scopes: Sequence[str]) -> dict[str, float]: ...


class NoLimits:
    """Every send is granted at once."""

    def acquire(self, provider: str, count: int) -> tuple[int, float]:
        return count, 0.0

    def block(self, provider: str, seconds: float) -> None:
        return

    def held(self, scopes: Sequence[str]) -> dict[str, float]:
        return {}


def utc_now() -> datetime:
    return datetime.now(UTC)


def utc_day(now: datetime) -> date:
    """The UTC date of ``now``, the day a warm-up counts in."""
    return now.astimezone(UTC).date()


class RateLimiter:
    """Token buckets per provider in Redis; see the module docstring for the key layout.

    ``clock`` tells the day for warm-ups (an aware ``datetime``); the buckets themselves run
    on the Redis server's clock."""

    def __init__(
        self,
        client: redis.Redis,
        limits: Mapping[str, Sequence[Window]],
        warmups: Mapping[str, Warmup] | None = None,
        *,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self._limits = {p: list(w) for p, w in limits.items() if w}
        self._warmups = dict(warmups or {})
        self._clock = clock
        self._client = client
        self._acquire = client.register_script(ACQUIRE)
        self._block = client.register_script(BLOCK)

    def acquire(self, provider: str, count: int) -> tuple[int, float]:
        """Take up to ``count`` sends for ``provider``: (granted, seconds until more)."""
        windows = self.windows(provider)
        if not windows or count <= 0:
            return count, 0.0
        granted, wait_ms = self._acquire(
            keys=self._keys(provider, windows), args=self._args(count, windows)
        )
        return int(granted), float(wait_ms) / 1000.0

    def windows(self, provider: str) -> list[Window]:
        """The windows in force for ``provider`` now: its fixed ones and its warm-up's day."""
        return windows_on(self._limits, self._warmups, provider, utc_day(self._clock()))

    def block(self, provider: str, seconds: float) -> None:
        """Let no worker send to ``provider`` (or to one receiver, a scope without windows) for
        ``seconds``: it asked us to back off."""
        if seconds <= 0:
            return
        windows = self.windows(provider)
        if windows:
            self._block(keys=self._keys(provider, windows), args=self._args(seconds, windows))
        else:
            ms = max(1, math.ceil(min(seconds, MAX_HOLD_SECONDS) * 1000))
            self._client.set(f"notifier:hold:{provider}", 1, px=ms)

    def held(self, scopes: Sequence[str]) -> dict[str, float]:
        """Of ``scopes``, those held back now (see ``block``), with the seconds left."""
        if not scopes:
            return {}
        pipe = self._client.pipeline(transaction=False)
        for scope in scopes:
            pipe.pttl(f"notifier:hold:{scope}")
        return {s: int(ms) / 1000.0 for s, ms in zip(scopes, pipe.execute(), strict=True) if ms > 0}

    @staticmethod
    def _keys(provider: str, windows: Sequence[Window]) -> list[str]:
        return [f"notifier:rate:{provider}:{w.spelling}" for w in windows]

    @staticmethod
    def _args(first: float, windows: Sequence[Window]) -> list[Any]:
        args: list[Any] = [first]
        for w in windows:
            args += [repr(w.rate_per_ms), w.burst]
        return args


def windows_on(
    limits: Mapping[str, Sequence[Window]],
    warmups: Mapping[str, Warmup],
    provider: str,
    today: date,
) -> list[Window]:
    """``provider``'s fixed windows and, if it warms up, the day's window of its warm-up."""
    windows = list(limits.get(provider, ()))
    warmup = warmups.get(provider)
    if warmup is not None:
        windows.append(warmup.window_on(today))
    return windows


@dataclass(frozen=True, slots=True)
class ProviderRate:
    """What limits one provider on one day, as ``notifier stats`` tells it."""

    provider: str
    #: the fixed windows' spellings (``NOTIFIER_RATE_LIMITS``)
    windows: list[str]
    warmup: Warmup | None
    today: date

    @property
    def current(self) -> list[str]:
        """Every window in force today, the warm-up's as today's limit (``400/s``)."""
        if self.warmup is None:
            return self.windows
        return [*self.windows, self.warmup.rate_on(self.today)]


def rates(
    limits: Mapping[str, Sequence[Window]], warmups: Mapping[str, Warmup], now: datetime
) -> list[ProviderRate]:
    """Each limited provider's windows on ``now``'s UTC day, by provider name."""
    today = utc_day(now)
    return [
        ProviderRate(p, [w.spelling for w in limits.get(p, ())], warmups.get(p), today)
        for p in sorted(set(limits) | set(warmups))
        if limits.get(p) or p in warmups
    ]
