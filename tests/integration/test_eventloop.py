"""The process's event loop: one per process, and a forked child makes its own."""

from __future__ import annotations

import asyncio
import os
import threading
import warnings

import pytest

from notifier import eventloop


async def _where() -> tuple[int, str]:
    return os.getpid(), threading.current_thread().name


def test_coroutines_run_on_one_daemon_thread() -> None:
    loop = eventloop.get()
    assert eventloop.get() is loop
    assert eventloop.run(_where()) == (os.getpid(), "notifier-event-loop")


def test_waiting_on_the_loop_from_the_loop_is_refused() -> None:
    async def nested() -> None:
        eventloop.run(_where())

    with pytest.raises(RuntimeError, match="would wait for itself"):
        eventloop.run(nested())


def test_a_forked_child_starts_a_loop_of_its_own() -> None:
    """Celery's prefork pool forks after import; the parent's loop thread is not in the child."""
    assert eventloop.run(_where())[0] == os.getpid()  # the parent's loop is running
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # forking a threaded process
        pid = os.fork()
    if pid == 0:  # the child: report through the exit code, never return into pytest
        code = 1
        try:
            seen = eventloop.run(asyncio.wait_for(_where(), 5))
            code = 0 if seen == (os.getpid(), "notifier-event-loop") else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_stop_ends_the_loop_and_a_later_use_starts_another() -> None:
    before = eventloop.get()
    eventloop.stop()
    assert before.is_closed()
    assert eventloop.run(_where())[0] == os.getpid()
    assert eventloop.get() is not before
