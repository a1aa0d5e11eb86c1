"""The blocking HTTP client a provider shares between its send threads."""

from __future__ import annotations

import threading
from collections.abc import Callable

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
