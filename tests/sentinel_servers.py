"""A Redis primary, its replica and three Sentinels of this test's own, on free loopback ports.

For failover tests: the Sentinels watch the primary with a quorum of 2 and call it down after
a second of silence, so ``kill_primary`` (SIGKILL) leads them to promote the replica within a
few seconds. Nothing persists; ``close`` stops every process and removes every file.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import redis

from tests.redis_server import RedisServer
from tests.server_process import free_port

#: The name the Sentinels monitor the primary under.
MASTER = "notifier-test"
#: Silence after which a Sentinel holds the primary down; two agreeing start the failover.
DOWN_AFTER_MS = 1000
#: How long a failover may take before another Sentinel tries (twice this).
FAILOVER_TIMEOUT_MS = 3000

_CONFIG = """\
port {port}
bind 127.0.0.1
daemonize no
dir {dir}
sentinel monitor {master} 127.0.0.1 {primary} 2
sentinel down-after-milliseconds {master} {down_after}
sentinel failover-timeout {master} {failover_timeout}
sentinel parallel-syncs {master} 1
"""


class SentinelServers:
    """``primary`` (a ``RedisServer``), ``replica`` (one of it) and three ``redis-sentinel``
    processes watching them."""

    def __init__(self) -> None:
        binary = shutil.which("redis-sentinel")
        if binary is None:
            raise RuntimeError("redis-sentinel is not on PATH; install Redis Sentinel")
        self.binary = binary
        # The replica's first sync at once, not after the 5 s Redis waits for more replicas.
        self.primary = RedisServer("--repl-diskless-sync-delay", "0")
        self.replica = RedisServer("--replicaof", "127.0.0.1", str(self.primary.port))
        self.ports = [free_port() for _ in range(3)]
        self.dir = Path(tempfile.mkdtemp(prefix="notifier-test-sentinel-"))
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []

    def start(self, timeout: float = 30.0) -> SentinelServers:
        """Start them all; return once the replica is in sync and every Sentinel knows the
        replica and the two other Sentinels (without which no failover could start). What
        started is stopped again if the rest does not."""
        try:
            return self._start(timeout)
        except BaseException:
            self.close()
            raise

    def _start(self, timeout: float) -> SentinelServers:
        self.primary.start()
        self.replica.start()
        _wait(lambda: _link_up(self.replica.port), timeout, "the replica to sync")
        for port in self.ports:
            config = self.dir / f"sentinel-{port}.conf"  # a Sentinel rewrites its own file
            config.write_text(
                _CONFIG.format(
                    port=port,
                    dir=self.dir,
                    master=MASTER,
                    primary=self.primary.port,
                    down_after=DOWN_AFTER_MS,
                    failover_timeout=FAILOVER_TIMEOUT_MS,
                )
            )
            log = (self.dir / f"sentinel-{port}.log").open("wb")
            self._logs.append(log)
            self.procs.append(
                subprocess.Popen([self.binary, str(config)], stdout=log, stderr=subprocess.STDOUT)
            )
        _wait(self._ready, timeout, "every Sentinel to know the replica and the others")
        return self

    @property
    def addresses(self) -> str:
        """``NOTIFIER_REDIS_SENTINELS`` for these Sentinels."""
        return ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def masters(self) -> list[int | None]:
        """The primary's port as each Sentinel names it now (``None``: no answer)."""
        named: list[int | None] = []
        for port in self.ports:
            address = None
            with contextlib.suppress(redis.RedisError), _client(port) as sentinel:
                address = sentinel.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER)
            named.append(int(address[1]) if address else None)
        return named

    def kill_primary(self) -> int:
        """SIGKILL the primary, as a crashed machine would leave it; its PID, once reaped."""
        proc = self.primary.proc
        assert proc is not None
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        self.primary.proc = None
        return proc.pid

    def log(self) -> str:
        """What the Sentinels logged, one after the other."""
        return "\n".join(
            (self.dir / f"sentinel-{port}.log").read_text(errors="replace") for port in self.ports
        )

    def close(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        for log in self._logs:
            log.close()
        self.replica.close()
        self.primary.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _ready(self) -> bool:
        for port in self.ports:
            try:
                with _client(port) as sentinel:
                    flat = sentinel.execute_command("SENTINEL", "MASTER", MASTER)
            except redis.RedisError:
                return False
            state = dict(zip(flat[::2], flat[1::2], strict=True))
            if int(state[b"num-slaves"]) < 1 or int(state[b"num-other-sentinels"]) < 2:
                return False
        return True


def role(port: int) -> str | None:
    """``master`` or ``slave``, as the Redis server on ``port`` says; ``None``: no answer."""
    with contextlib.suppress(redis.RedisError), _client(port) as server:
        return str(server.role()[0], "ascii")
    return None


def _client(port: int) -> redis.Redis:
    return redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1)


def _link_up(port: int) -> bool:
    with contextlib.suppress(redis.RedisError), _client(port) as server:
        return bool(server.info("replication").get("master_link_status") == "up")
    return False


def _wait(ready: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)
