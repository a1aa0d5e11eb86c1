"""Child processes let go together: each connects, says it is ready, and starts its work at one
signal, so that a measurement starts when all of them do."""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Any

import psycopg

from bench.common import CpuMeter, SetupError, backend_pids
from bench.harness import POLL

#: A child: ``target(url, batch, ready, go, results)`` connects, puts its pid on ``ready``, waits
#: for ``go``, works, and puts one report (a dict, with ``"error"`` if it failed) on ``results``.
Child = Callable[[str, int, "Queue[Any]", Event, "Queue[Any]"], None]


def run_children(
    target: Child, url: str, database: str, processes: int, batch: int, timeout: float = 600
) -> tuple[float, list[dict[str, Any]], float]:
    """Start ``processes`` children, let them go together and wait for their reports.

    Returns (Unix time of the start signal, their reports, CPU of the database's backends other
    than ours while they ran).
    """
    name = getattr(target, "__name__", "child")
    ctx = multiprocessing.get_context("spawn")
    ready: Queue[Any] = ctx.Queue()
    results: Queue[Any] = ctx.Queue()
    go = ctx.Event()
    procs: list[BaseProcess] = []
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            for _ in range(processes):
                proc = ctx.Process(target=target, args=(url, batch, ready, go, results))
                proc.daemon = True
                proc.start()
                procs.append(proc)
            _wait_ready(procs, ready, results, name)
            meter = CpuMeter()
            backends = backend_pids(conn, database)
            meter.start(backends)
            started = time.time()
            go.set()
            reports: list[dict[str, Any]] = []
            deadline = time.monotonic() + timeout
            while len(reports) < processes:
                meter.sample(backends)
                with contextlib.suppress(queue.Empty):
                    reports.append(results.get(timeout=POLL))
                if time.monotonic() > deadline:
                    raise SetupError(f"{name} did not finish within {timeout:.0f} s")
            meter.sample(backends)
    finally:
        for child in procs:
            child.join(5)
            if child.is_alive():
                child.kill()
                child.join()
    errors = [r["error"] for r in reports if "error" in r]
    if errors:
        raise SetupError(f"{name} failed: {errors[0]}")
    return started, reports, meter.seconds


def _wait_ready(procs: list[BaseProcess], ready: Queue[Any], results: Queue[Any], app: str) -> None:
    """Wait until every child is connected; a child's failure ends the wait at once."""
    waiting = len(procs)
    deadline = time.monotonic() + 60
    while waiting:
        try:
            ready.get(timeout=POLL)
            waiting -= 1
            continue
        except queue.Empty:
            pass
        with contextlib.suppress(queue.Empty):
            report = results.get_nowait()
            raise SetupError(f"{app} failed before the start: {report.get('error', report)}")
        dead = [p.exitcode for p in procs if not p.is_alive()]
        if dead or time.monotonic() > deadline:
            raise SetupError(f"{app}: {waiting} processes not ready (exit codes {dead})")
