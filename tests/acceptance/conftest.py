"""Run notifier the way production does: ``celery -A notifier worker``, ``beat`` and ``flower``
as processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest
from sqlalchemy import Engine, text

from tests.server_process import free_port, listening
from tests.smtp_sink import SmtpSink

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Services:
    """Starts worker and beat processes with this test's environment; stops them all at the end."""

    env: dict[str, str]
    logs: Path
    #: How ``celery`` is started, and where: this test run's, from the repository, unless a test
    #: runs an installed copy.
    celery: tuple[str, ...] = (sys.executable, "-m", "celery")
    cwd: Path = REPO
    procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    _logs: list[IO[bytes]] = field(default_factory=list)

    def _start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.logs / f"{name}.log").open("wb")
        self._logs.append(log)
        proc = subprocess.Popen(
            [*self.celery, "-A", "notifier", *args],
            cwd=self.cwd,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append((name, proc))
        return proc

    def worker(self, name: str = "w1", concurrency: int = 2) -> subprocess.Popen[bytes]:
        return self._start(
            name,
            "worker",
            "--loglevel=INFO",
            f"--concurrency={concurrency}",
            f"--hostname={name}@%h",
            "--without-mingle",
            "--without-gossip",
        )

    def beat(self, name: str = "beat") -> subprocess.Popen[bytes]:
        return self._start(
            name, "beat", "--loglevel=INFO", f"--schedule={self.logs / name}-schedule"
        )

    def pid(self, name: str) -> int:
        """The PID of the process started as ``name`` (a worker's main process)."""
        return next(proc.pid for n, proc in self.procs if n == name)

    def children(self, name: str) -> list[int]:
        """PIDs of the living child processes of ``name``: a prefork worker's pool processes."""
        return sorted(
            pid
            for pid, (state, ppid) in _proc_table().items()
            if ppid == self.pid(name) and state != "Z"
        )

    def log(self, name: str) -> str:
        """Everything ``name`` has logged so far."""
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        for _, proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for _, proc in self.procs:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for log in self._logs:
            log.close()

    def output(self) -> str:
        return "\n".join(
            f"--- {name} ---\n{(self.logs / f'{name}.log').read_text(errors='replace')[-3000:]}"
            for name, _ in self.procs
        )


@pytest.fixture
def services(
    database_url: str,
    redis_url: str,
    smtp_sink: SmtpSink,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[Services]:
    """Worker and beat processes talk to this test's database, Redis and SMTP sink."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k.startswith("NOTIFIER_") or k in ("PATH", "HOME", "LANG", "PYTHONPATH", "VIRTUAL_ENV")
    }
    env.update(
        NOTIFIER_DATABASE_URL=database_url,
        NOTIFIER_REDIS_URL=redis_url,
        NOTIFIER_DISPATCH_INTERVAL="1",
        NOTIFIER_RETRY_BASE_SECONDS="1",
        NOTIFIER_RETRY_MAX_SECONDS="8",
        PYTHONUNBUFFERED="1",
    )
    svc = Services(env, tmp_path)
    yield svc
    svc.stop()
    report = request.node.stash.get(_failed_key, False)
    if report:
        print(svc.output())


_failed_key = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    report = yield
    if getattr(report, "when", None) == "call" and getattr(report, "failed", False):
        item.stash[_failed_key] = True
    return report


@contextmanager
def running_flower(env: Mapping[str, str], login: tuple[str, str], log: Path) -> Iterator[int]:
    """Flower as docker-compose.yml runs it (``celery -A notifier flower``, ``login`` in
    ``FLOWER_BASIC_AUTH``) with ``env``, on a free loopback port, its output in ``log``: the
    port, once Flower listens on it (30 s at most). Stopped on the way out: SIGTERM to its
    process group, SIGKILL after 15 s."""
    port = free_port()
    command = [sys.executable, "-m", "celery", "-A", "notifier", "flower"]
    with log.open("wb") as output:
        proc = subprocess.Popen(
            [*command, f"--port={port}", "--address=127.0.0.1"],
            cwd=REPO,
            env={**env, "FLOWER_BASIC_AUTH": ":".join(login)},
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 30
        while not listening(port):
            said = log.read_text(errors="replace")
            assert proc.poll() is None, f"Flower exited ({proc.returncode}):\n{said}"
            assert time.monotonic() < deadline, f"Flower not listening after 30 s:\n{said}"
            time.sleep(0.2)
        yield port
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _proc_table() -> dict[int, tuple[str, int]]:
    """Every process on the machine: PID -> (state letter, parent PID), read from /proc."""
    table = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            state, ppid = stat.read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):  # exited while we looked
            continue
        table[int(stat.parent.name)] = (state, int(ppid))
    return table


def unfinished(engine: Engine) -> int:
    """Rows still to be sent or retried: ``pending`` or ``processing``."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM notifications WHERE status IN ('pending', 'processing')")
            ).scalar_one()
        )


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
