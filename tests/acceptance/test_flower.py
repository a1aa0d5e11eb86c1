"""Flower, started the way docker-compose.yml starts it, lets nobody in without its login."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.acceptance.conftest import REPO


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def flower(redis_url: str, tmp_path: Path) -> Iterator[str]:
    """Flower on a free loopback port with FLOWER_BASIC_AUTH=user:pass; its base URL."""
    port = _free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k.startswith("NOTIFIER_") or k in ("PATH", "HOME", "LANG", "PYTHONPATH", "VIRTUAL_ENV")
    }
    env.update(FLOWER_BASIC_AUTH="user:pass", NOTIFIER_REDIS_URL=redis_url, PYTHONUNBUFFERED="1")
    log_path = tmp_path / "flower.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "notifier",
                "flower",
                f"--port={port}",
                "--address=127.0.0.1",
            ],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 30
        while not _listening(port):
            output = log_path.read_text(errors="replace")
            assert proc.poll() is None, f"Flower exited ({proc.returncode}):\n{output}"
            assert time.monotonic() < deadline, f"Flower not listening after 30 s:\n{output}"
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


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
