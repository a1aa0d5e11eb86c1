"""Helpers shared by the benchmarks in ``bench/``: databases, Redis, worker processes, /proc.

Nothing here measures anything. The benchmarks run notifier exactly as production does (``python
-m celery -A notifier worker|beat`` from the repository root), each process in a session of its
own so that Ctrl-C reaches only the benchmark, which then stops them in order: SIGTERM to each
main process, SIGKILL to the whole process group of any still there after a timeout.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any, TypeVar

import psycopg
import redis

from notifier.db.migrate import migrate

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[1]
#: The server, without a database name (``postgresql://user@host:port``).
POSTGRES = os.environ.get("NOTIFIER_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432")
#: Celery's log lines of level WARNING and above: ``[... WARNING/MainProcess] ...``.
_PROBLEM = re.compile(r"\b(WARNING|ERROR|CRITICAL)/")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

Conn = psycopg.Connection[tuple[Any, ...]]


class SetupError(Exception):
    """The benchmark could not be set up; nothing was measured."""


def psycopg_url(url: str) -> str:
    """psycopg spells the scheme ``postgresql://``; SQLAlchemy's driver suffix goes."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def sqlalchemy_url(url: str) -> str:
    """``notifier`` takes SQLAlchemy URLs and runs on psycopg 3."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


# --- PostgreSQL and Redis ----------------------------------------------------------------------


def database_url(name: str) -> str:
    return f"{psycopg_url(POSTGRES).rstrip('/')}/{name}"


def admin_connect() -> Conn:
    return psycopg.connect(database_url("postgres"), autocommit=True, connect_timeout=10)


def scratch_database(name: str) -> str:
    """Drop and recreate database ``name``, empty; its URL."""
    try:
        with admin_connect() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        raise SetupError(f"cannot recreate {name} on {psycopg_url(POSTGRES)}: {exc}") from exc
    return database_url(name)


def recreate_database(name: str) -> str:
    """Drop and recreate database ``name``, migrate it with ``notifier migrate``; its URL."""
    url = scratch_database(name)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # its "database ... is at ..." lines
            migrate(sqlalchemy_url(url))
    except Exception as exc:
        raise SetupError(f"cannot migrate {name}: {exc}") from exc
    return url


def drop_databases(names: Iterable[str]) -> None:
    with admin_connect() as admin:
        for name in names:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def free_port() -> int:
    """A TCP port free on loopback just now, for a server of the run's own."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def flush_redis(url: str) -> None:
    client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    try:
        client.flushdb()
    except redis.RedisError as exc:
        raise SetupError(f"cannot flush Redis at {url}: {exc}") from exc
    finally:
        client.close()


def server_settings(conn: Conn, names: Iterable[str]) -> dict[str, str]:
    """``SHOW`` values of the server, e.g. ``autovacuum`` or ``synchronous_commit``."""
    values = {}
    for name in names:
        row = conn.execute(f"SHOW {name}").fetchone()
        values[name] = str(row[0]) if row else "?"
    return values


def waker_listening(conn: Conn, database: str) -> bool:
    """True once a worker's wake-up listener has run its LISTEN on ``database``."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
        " AND application_name = 'notifier-wake' AND query ILIKE 'LISTEN%%'",
        (database,),
    ).fetchone()
    return row is not None and int(row[0]) > 0


def backend_pids(conn: Conn, database: str, application_name: str | None = None) -> list[int]:
    """Server processes connected to ``database`` (optionally of one application), not ours."""
    sql = (
        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
        " AND backend_type = 'client backend'"
    )
    params: list[Any] = [database]
    if application_name is not None:
        sql += " AND application_name = %s"
        params.append(application_name)
    return [int(r[0]) for r in conn.execute(sql, params).fetchall()]


# --- /proc -------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of process ``pid`` so far; None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime


def proc_status_kib(pid: int, key: str) -> int | None:
    """A ``kB`` line of /proc/<pid>/status (``VmRSS``, ``VmHWM``); None if gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return None


def children(pid: int) -> list[int]:
    """The direct children of ``pid``, from /proc/<pid>/task/*/children."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found += [int(c) for c in (task / "children").read_text().split()]
    return found


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo += children(current)
    return tree


@dataclass
class CpuMeter:
    """CPU seconds used by a changing set of processes between ``start`` and ``stop``.

    Processes that appear later count from zero; those gone before ``stop`` keep their last
    reading (``sample`` now and then so that little is lost).
    """

    first: dict[int, float] = field(default_factory=dict)
    last: dict[int, float] = field(default_factory=dict)

    def start(self, pids: Iterable[int]) -> None:
        for pid in pids:
            value = cpu_seconds(pid)
            if value is not None:
                self.first[pid] = self.last[pid] = value

    def sample(self, pids: Iterable[int]) -> None:
        for pid in pids:
            value = cpu_seconds(pid)
            if value is not None:
                self.last[pid] = value

    @property
    def seconds(self) -> float:
        return sum(v - self.first.get(pid, 0.0) for pid, v in self.last.items())


# --- worker and beat ---------------------------------------------------------------------------


@dataclass
class Services:
    """Celery processes as production runs them, each in a process group of its own."""

    env: dict[str, str]
    workdir: Path
    stop_timeout: float = 20.0
    procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    _logs: list[IO[bytes]] = field(default_factory=list)

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.workdir / f"{name}.log").open("wb")
        self._logs.append(log)
        argv = [sys.executable, "-m", "celery", "-A", "notifier", *args]
        proc = subprocess.Popen(
            argv,
            cwd=REPO,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches us only; we stop them in order
        )
        self.procs.append((name, proc))
        self.commands.append(f"cd {REPO} && {shlex.join(argv)}")
        return proc

    def pid(self, name: str) -> int:
        return next(proc.pid for n, proc in self.procs if n == name)

    def check_alive(self) -> None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                raise SetupError(f"{name} exited with status {proc.returncode}")

    def log(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def problems(self) -> list[str]:
        """WARNING and worse lines of every process's log."""
        return [
            line
            for name, _ in self.procs
            for line in self.log(name).splitlines()
            if _PROBLEM.search(line)
        ]

    def stop(self) -> None:
        """SIGTERM to each main process, as ``docker stop`` does (a worker passes it on to its
        pool processes); SIGKILL to the process groups of those still there after the timeout.
        """
        try:
            for _, proc in self.procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + self.stop_timeout
            for name, proc in self.procs:
                try:
                    proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    print(f"  {name} still running after {self.stop_timeout:.0f}s: SIGKILL")
        finally:  # also on a second Ctrl-C while waiting
            for _, proc in self.procs:
                signal_group(proc, signal.SIGKILL)  # the pool processes too, if any are left
                proc.wait()
            for log in self._logs:
                log.close()


def signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)  # its own session: the group id is its pid


def service_env(
    database: str, redis_url: str, workdir: Path, settings: Mapping[str, str]
) -> dict[str, str]:
    """The calling environment without its ``NOTIFIER_*`` variables, plus the given ones
    (``{"batch_size": "500"}`` becomes ``NOTIFIER_BATCH_SIZE=500``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFIER_")}
    env.update(
        NOTIFIER_DATABASE_URL=database,
        NOTIFIER_REDIS_URL=redis_url,
        NOTIFIER_HEARTBEAT_FILE=str(workdir / "heartbeat"),
        PYTHONUNBUFFERED="1",
    )
    env.update({f"NOTIFIER_{k.upper()}": v for k, v in settings.items()})
    return env


def celery_ping(env: dict[str, str]) -> bool:
    """True once ``celery inspect ping`` gets an answer from a worker."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "notifier", "inspect", "ping", "--timeout=1"],
            cwd=REPO,
            env=env,
            capture_output=True,
            timeout=30,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0 and b"pong" in done.stdout


def wait_until(
    predicate: Callable[[], bool], timeout: float, what: str, services: Services | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if services is not None:
            services.check_alive()
        if predicate():
            return
        time.sleep(0.2)
    raise SetupError(f"timed out after {timeout:.0f}s waiting for {what}")


# --- the report --------------------------------------------------------------------------------


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def git_commit() -> str:
    """The checked-out commit, ``+changes`` if tracked files differ (reads only; no index
    refresh is written: ``GIT_OPTIONAL_LOCKS=0``)."""
    commit = _git("rev-parse", "--short", "HEAD")
    changed = _git("status", "--porcelain", "--untracked-files=no")
    return (commit or "unknown") + ("+changes" if changed else "")


def _git(*args: str) -> str:
    """What ``git`` printed in the repository, stripped; empty if it could not run."""
    try:
        done = subprocess.run(
            ["git", *args],
            cwd=REPO,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip()


def raise_interrupt(signum: int, _: FrameType | None) -> None:
    """A SIGTERM handler: stop the benchmark the way Ctrl-C does, cleaning up."""
    raise KeyboardInterrupt(f"signal {signum}")


def run_interruptibly(run: Callable[[T], int], args: T) -> int:
    """``run(args)``, stopped by Ctrl-C or SIGTERM alike (everything it started is stopped on
    the way out); 130 when interrupted."""
    signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        return run(args)
    except KeyboardInterrupt:
        print("\ninterrupted; everything started was stopped", file=sys.stderr)
        return 130
