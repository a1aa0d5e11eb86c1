"""A Redis server of this test run's own, on a free loopback port.

Two test runs on one machine (a developer's beside CI's) must not flush or stop each other's
Redis, so each run starts its own ``redis-server`` with no persistence, and fault tests stop and
restart this one, never the machine's.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import redis

from tests.server_process import free_port, start_server, stop_server


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
        self.port = free_port()
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
        log = self.dir / "redis.log"  # a restart's output follows the last start's
        what = f"redis-server on port {self.port}"
        self.proc = start_server(args, log, self.alive, what=what, timeout=timeout)
        return self

    def stop(self) -> None:
        """Stop the server for real (SIGTERM, then wait for the process to be gone)."""
        if self.proc is not None:
            stop_server(self.proc)
            self.proc = None

    def alive(self) -> bool:
        try:
            return bool(redis.Redis(host=self.host, port=self.port, socket_timeout=1).ping())
        except redis.RedisError:
            return False

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
