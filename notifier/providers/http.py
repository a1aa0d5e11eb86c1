"""What the HTTP providers share: one blocking client for their send threads, and reading a
``Retry-After``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx


class SharedClient:
    """One ``httpx.Client`` for every send thread of a provider, made on first use.

    It is kept across batches, so connections to the provider are reused; ``close`` lets them
    go (worker shutdown, tests), and a later ``get`` makes a new client.
    """

    def __init__(self, make: Callable[[], httpx.Client]) -> None:
        self._make = make
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    def get(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                self._client = self._make()
            return self._client

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds a ``Retry-After`` asks for (delta-seconds or an HTTP-date); ``None`` if unusable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        at = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if at.tzinfo is None:  # "-0000" dates parse naive; HTTP-dates are always GMT
        at = at.replace(tzinfo=UTC)
    return max(0.0, (at - (now or datetime.now(UTC))).total_seconds())
