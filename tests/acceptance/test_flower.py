"""Flower, started the way docker-compose.yml starts it, lets nobody in without its login."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.acceptance.conftest import running_flower


@pytest.fixture
def flower(redis_url: str, tmp_path: Path) -> Iterator[str]:
    """Flower on a free loopback port with FLOWER_BASIC_AUTH=user:pass; its base URL."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k.startswith("NOTIFIER_") or k in ("PATH", "HOME", "LANG", "PYTHONPATH", "VIRTUAL_ENV")
    }
    env.update(NOTIFIER_REDIS_URL=redis_url, PYTHONUNBUFFERED="1")
    with running_flower(env, ("user", "pass"), tmp_path / "flower.log") as port:
        yield f"http://127.0.0.1:{port}"


def test_flower_refuses_strangers_and_admits_its_user(flower: str) -> None:
    with httpx.Client(base_url=flower, timeout=10) as http:
        refused = http.get("/")
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Basic")
        assert http.get("/", auth=("user", "wrong")).status_code == 401
        assert http.get("/api/workers").status_code == 401

        assert http.get("/", auth=("user", "pass")).status_code == 200
        # The compose healthcheck needs no login; Prometheus scrapes with the login.
        assert http.get("/healthcheck").status_code == 200
        metrics = http.get("/metrics", auth=("user", "pass"))
        assert metrics.status_code == 200
        assert "# TYPE" in metrics.text
