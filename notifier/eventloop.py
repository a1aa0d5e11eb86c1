"""The process's asyncio event loop, running in a daemon thread, for sends that need no thread.

One loop per process, made on first use: a Celery prefork pool forks its processes after import,
and a loop made before a fork would have no thread in the child, so a child forgets what it
inherited and makes its own. The dispatcher starts its asynchronous sends here
(``notifier.delivery.sender``); a provider's blocking ``send`` may wait here for its own
``send_async``, so that both share one connection pool.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None


def get() -> asyncio.AbstractEventLoop:
    """The running loop of this process, started on the first call."""
    global _loop, _thread
    with _lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            started = threading.Event()
            thread = threading.Thread(
                target=_run, args=(loop, started), name="notifier-event-loop", daemon=True
            )
            thread.start()
            started.wait()
            _loop, _thread = loop, thread
        return _loop


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the loop and wait for its result, from any thread but the loop's own."""
    return submit(coro).result()


def submit(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Start ``coro`` on the loop, from any thread but the loop's own; its future, to wait for
    within a timeout, or to leave running and be told (``add_done_callback``) when it ends."""
    loop = get()
    if in_loop_thread():
        coro.close()
        raise RuntimeError("called from the event loop's own thread, it would wait for itself")
    return asyncio.run_coroutine_threadsafe(coro, loop)


def finish_on(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any]) -> None:
    """Run ``coro`` to its end on ``loop``, the process's or another, running in its thread or
    not, from any thread but that loop's own: closing what a provider made on it (``shutdown``),
    within ten seconds when the loop runs."""
    if loop.is_running():
        asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=10)
    else:
        loop.run_until_complete(coro)


def in_loop_thread() -> bool:
    """Whether the caller runs on the loop's thread (where nothing may block)."""
    return _thread is not None and threading.current_thread() is _thread


def stop(timeout: float = 5.0) -> None:
    """Cancel what still runs on the loop, then stop and close it (worker shutdown, tests).

    A later ``get`` starts a new loop.
    """
    global _loop, _thread
    with _lock:
        loop, thread, _loop, _thread = _loop, _thread, None, None
    if loop is None or thread is None:
        return
    with contextlib.suppress(TimeoutError):
        asyncio.run_coroutine_threadsafe(_wind_down(), loop).result(timeout)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout)
    if not thread.is_alive():
        loop.close()


def _run(loop: asyncio.AbstractEventLoop, started: threading.Event) -> None:
    asyncio.set_event_loop(loop)
    loop.call_soon(started.set)
    loop.run_forever()


async def _wind_down() -> None:
    loop = asyncio.get_running_loop()
    tasks = [t for t in asyncio.all_tasks(loop) if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await loop.shutdown_asyncgens()
    await loop.shutdown_default_executor()


def _forget_after_fork() -> None:
    """In a forked child the parent's loop thread does not exist: start afresh on next use."""
    global _lock, _loop, _thread
    _lock = threading.Lock()  # another thread may have held it at the moment of the fork
    _loop, _thread = None, None


os.register_at_fork(after_in_child=_forget_after_fork)
