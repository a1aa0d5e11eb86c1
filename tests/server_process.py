"""A server process of a test's own on a free loopback port: started with its output in a log
file, waited for until it answers, and stopped.

What answering means, and where the log goes, is the caller's to say (``tests.redis_server``,
``tests.pgbouncer_server``). ``listening`` is the plainest sign of life: something accepts
connections on the port; once a server is stopped, nothing should.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1 at ``port``."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def process_gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie not yet reaped by its parent counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def start_server(
    args: Sequence[str],
    log: Path,
    answers: Callable[[], bool],
    *,
    what: str,
    timeout: float,
) -> subprocess.Popen[bytes]:
    """Start ``args`` with its output and errors appended to ``log``, and return it once
    ``answers()`` holds. If the process exits first, or ``timeout`` seconds pass, it is stopped
    and ``RuntimeError`` names ``what`` and carries the end of ``log``."""
    with log.open("ab") as output:
        proc = subprocess.Popen(args, stdout=output, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while not answers():
        if proc.poll() is not None or time.monotonic() > deadline:
            exited = proc.poll()
            stop_server(proc)
            why = f"exited ({exited})" if exited is not None else f"no answer after {timeout} s"
            said = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{what} did not start, {why}:\n{said}")
        time.sleep(0.05)
    return proc


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """Stop ``proc`` for real: SIGTERM, SIGKILL if it is still there after 10 s, and wait until
    it is gone."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
