"""Fixtures the integration tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.events_endpoint import Endpoint, running_endpoint


@pytest.fixture
def endpoint(database_url: str, redis_url: str, tmp_path: Path) -> Iterator[Endpoint]:
    """``notifier events`` running on a port of its own against the test's database."""
    with running_endpoint(database_url, redis_url, tmp_path) as ep:
        yield ep
