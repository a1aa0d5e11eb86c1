"""A Redis server of this test run's own, on a free loopback port.

Two test runs on one machine (a developer's beside CI's) must not flush or stop each other's
Redis, so each run starts its own ``redis-server`` with no persistence, and fault tests stop and
restart this one, never the machine's.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import redis


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """``redis-server`` on 127.0.0.1 (or ``host``) at a port of its own; ``stop`` and ``start``
    for faults."""

    def __init__(self, *options: str, host: str = "127.0.0.1", inside: Sequence[str] = ()) -> None:
        """``options``: more of ``redis-server``'s, e.g. ``--replicaof 127.0.0.1 6379``.
        ``host``: the one address it listens on; ``inside``: what it runs under, e.g. ``ip
        netns exec NAME`` to run on a test host (``tests.testhosts``)."""
        self.host = host
        self.inside = list(inside)
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not on PATH; install Redis to run the tests")
        self.binary = binary
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="notifier-test-redis-"))
        self.options = options
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        args = [
            *self.inside, self.binary, "--port", str(self.port), "--bind", self.host,
            "--save", "", "--appendonly", "no", "--dir", str(self.dir), *self.options,
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not self.alive():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        """Stop the server for real (SIGTERM, then wait for the process to be gone)."""
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def alive(self) -> bool:
        try:
            return bool(redis.Redis(host=self.host, port=self.port, socket_timeout=1).ping())
        except redis.RedisError:
            return False

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
