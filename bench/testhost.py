"""A PostgreSQL a network round trip away, for the benchmarks' ``--round-trip``.

In production PostgreSQL is a hop away from the workers; on one machine it is on loopback. A
test host is a network namespace joined to this one by a veth pair (``testhost up`` of the
netdelay tools: ``NOTIFIER_BENCH_NETDELAY``, by default ``shared/netdelay`` beside the
repository). A PostgreSQL cluster of its own runs inside it, on the namespace's side of the
pair, with the machine's server settings that the benchmarks report (autovacuum off,
synchronous commit on, 128 MB of shared buffers); ``nfqdelay`` holds every packet between the
two sides for half the round trip asked for (the kernel has no ``netem``). The veth pair alone
takes about 0.1 ms, so the round trip a ``SELECT 1`` really takes is measured and reported with
each figure. Needs root, as namespaces do.

``with_round_trips`` runs a benchmark script as it was asked, on loopback, then once per round
trip against such a host, in one run: the same script, a child process of this one, with
``NOTIFIER_BENCH_POSTGRES`` pointing at the host.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

import psycopg

from bench.cluster import Cluster, run
from bench.common import REPO, SetupError

NETDELAY = Path(os.environ.get("NOTIFIER_BENCH_NETDELAY", REPO.parent / "shared" / "netdelay"))
#: The veth pair's own round trip, which the delay asked of nfqdelay leaves out.
VETH_MS = 0.1
#: The longest a benchmark may run against one host (nfqdelay stops after it).
MOST_SECONDS = 4 * 3600
#: What the host's server runs with: the machine's server settings that the benchmarks report.
SERVER = {
    "autovacuum": "off",
    "shared_buffers": "128MB",
    "synchronous_commit": "on",
    "max_connections": "200",
}


class RemotePostgres:
    """A PostgreSQL cluster on test host ``10.77.<index>.2``, ``round_trip_ms`` away."""

    def __init__(self, round_trip_ms: float, index: int) -> None:
        self.round_trip_ms = round_trip_ms
        self.index = index
        self.name = f"nbench{index}"
        self.address = f"10.77.{index}.2"
        self._delay: subprocess.Popen[bytes] | None = None
        self._testhost = NETDELAY / "testhost"
        if not self._testhost.exists():
            raise SetupError(
                f"no {self._testhost}: set NOTIFIER_BENCH_NETDELAY to the netdelay tools' folder"
            )
        self.cluster = Cluster(
            SERVER,
            host=self.address,
            port=5432,
            inside=["ip", "netns", "exec", self.name],
            clients=[f"10.77.{index}.0/24"],
            shutdown="immediate",
        )

    @property
    def url(self) -> str:
        return self.cluster.url

    def __enter__(self) -> RemotePostgres:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _start(self) -> None:
        self._host("down")
        self._host("up", str(self.index))
        self.cluster.start()
        each_way_us = max(0, round((self.round_trip_ms - VETH_MS) * 500))
        if each_way_us:
            self._delay = subprocess.Popen(
                [str(self._testhost), "delay", self.name, str(self.index), str(each_way_us),
                 str(MOST_SECONDS)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )  # fmt: skip
            time.sleep(0.5)
            if self._delay.poll() is not None:
                why = (self._delay.stderr.read() if self._delay.stderr else b"").decode()
                raise SetupError(f"nfqdelay did not start: {why.strip()[-300:]}")

    def measured_ms(self, samples: int = 50) -> float:
        """The median round trip of a ``SELECT 1``, in milliseconds."""
        with psycopg.connect(self.url + "/postgres", autocommit=True, connect_timeout=10) as c:
            c.execute("SELECT 1")
            times = []
            for _ in range(samples):
                started = time.perf_counter()
                c.execute("SELECT 1").fetchone()
                times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times)

    def close(self) -> None:
        if self._delay is not None and self._delay.poll() is None:
            self._delay.terminate()
            self._delay.wait(10)
        self.cluster.close()
        self._host("down")

    def _host(self, *args: str) -> None:
        name_args = [args[0], self.name, *args[1:]]
        run([str(self._testhost), *name_args], check=args[0] != "down")


def with_round_trips(
    round_trips: Sequence[float], argv: Sequence[str], run_here: Callable[[], int]
) -> int:
    """``run_here()`` on loopback, then this script again (``argv`` without its
    ``--round-trip``) against a test host at each of ``round_trips`` ms; the worst exit status."""
    print("== PostgreSQL on loopback", flush=True)
    status = run_here()
    for i, ms in enumerate(round_trips):
        with RemotePostgres(ms, 200 + (os.getpid() + i) % 50) as remote:
            measured = remote.measured_ms()
            print(
                f"\n== PostgreSQL on a test host {ms:g} ms away ({measured:.2f} ms measured for"
                f" a SELECT 1; {remote.url})",
                flush=True,
            )
            env = {**os.environ, "NOTIFIER_BENCH_POSTGRES": remote.url}
            done = subprocess.run([sys.executable, *argv], env=env, cwd=REPO, check=False)
            status = max(status, done.returncode)
    return status


def without_round_trip(argv: Sequence[str]) -> list[str]:
    """``argv`` without ``--round-trip X`` or ``--round-trip=X``."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--round-trip":
            skip = True
        elif not arg.startswith("--round-trip="):
            kept.append(arg)
    return kept
