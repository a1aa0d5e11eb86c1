"""The retry policy: when a failed notification is tried again, or that it is given up.

Pure: the clock and the random draw are passed in, so the policy is tested without sleeping.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with jitter.

    The delay after attempt ``n`` (1-based) is ``base * 2 ** (n - 1)``, capped at ``cap``; then a
    random fraction of up to ``jitter`` of it is taken off, so the delay lies in
    ``[d * (1 - jitter), d]`` and never exceeds ``cap``.
    """

    base: float = 30.0
    cap: float = 3600.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.base <= 0 or self.cap <= 0:
            raise ValueError("base and cap must be positive")
        if not 0 <= self.jitter < 1:
            raise ValueError("jitter must be in [0, 1)")

    def bounds(self, attempt: int) -> tuple[float, float]:
        """The shortest and longest delay after attempt number ``attempt`` (1-based)."""
        if attempt < 1:
            raise ValueError("attempt numbers start at 1")
        # 2 ** 63 overflows nothing in Python, but keep the exponent small anyway.
        full = min(self.cap, self.base * 2 ** min(attempt - 1, 62))
        return full * (1 - self.jitter), full

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait after attempt ``attempt``; ``rand()`` returns a float in [0, 1)."""
        low, high = self.bounds(attempt)
        return high - (high - low) * rand()


def next_attempt_at(
    policy: RetryPolicy,
    *,
    attempts: int,
    max_attempts: int,
    now: datetime,
    retry_after: float | None = None,
    rand: Callable[[], float] = random.random,
) -> datetime | None:
    """When to try again after a transient failure of attempt number ``attempts``.

    Returns ``None`` when the row has used up ``max_attempts`` and must be given up. A provider's
    ``retry_after`` (e.g. an HTTP ``Retry-After``) is honoured when it asks for a longer wait
    than the backoff, up to the policy's cap.
    """
    if attempts >= max_attempts:
        return None
    seconds = policy.delay(attempts, rand)
    if retry_after is not None and retry_after > seconds:
        seconds = min(retry_after, policy.cap)
    return now + timedelta(seconds=seconds)
