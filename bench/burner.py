"""A CPU load and nothing else: processes that spin for a set share of a core each.

The control a figure measured *beside* a load is read against: the same cores taken by a
load that sends, writes and wakes nothing tells what the cores alone cost the measured thing
on this machine, and so what any load of that size must cost it here.

Each process holds its own CPU time to ``share`` of the wall time since it started: it spins
while it is behind and sleeps a millisecond while it is ahead (a fixed spin-and-sleep period
overshoots its sleeps and burns less than asked). Its processes are one process tree (a
parent and its spinners): ``process_tree(burner.pid)`` reads what it took.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from types import TracebackType

#: The parent: starts ``n`` spinners of ``share`` each and waits for them, until killed.
_PARENT = """
import subprocess, sys
n, share, spin = int(sys.argv[1]), sys.argv[2], sys.argv[3]
procs = [subprocess.Popen([sys.executable, "-c", spin, share]) for _ in range(n)]
for proc in procs:
    proc.wait()
"""
_SPIN = """
import sys, time
share = float(sys.argv[1])
begun = time.perf_counter()
while True:
    if time.process_time() < share * (time.perf_counter() - begun):
        deadline = time.perf_counter() + 0.001
        while time.perf_counter() < deadline:
            pass
    else:
        time.sleep(0.001)
"""


class Burner:
    """``cores`` of CPU taken by ``processes`` spinners (each at most one core), from ``start``
    until ``stop`` (or the ``with`` block's end)."""

    def __init__(self, cores: float, processes: int = 2) -> None:
        if not 0 < cores <= processes:
            raise ValueError(f"cores must be in (0, {processes}]: {cores}")
        self.cores = cores
        self.processes = processes
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def start(self) -> Burner:
        share = str(self.cores / self.processes)
        argv = [sys.executable, "-c", _PARENT, str(self.processes), share, _SPIN]
        # a session of its own: stop() ends the spinners with their parent
        self.proc = subprocess.Popen(argv, start_new_session=True)
        return self

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None

    def __enter__(self) -> Burner:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
