"""Sending one row: through its channel's providers in order, in a thread or on the event loop.

A row goes to the next provider of its channel (``NOTIFIER_FAILOVER``) when one fails
transiently; only when the last has failed too is the attempt a ``Retry``, carrying each
provider's error. Where the send runs:

* on the worker process's event loop (``notifier.eventloop``), when the row names no guard and
  every provider of its chain overrides ``send_async``: up to
  ``async_send_concurrency`` at once, each bounded by its provider's total timeout, and
  cancelled for real if abandoned;
* in a thread pool of ``send_concurrency`` threads otherwise: guards are blocking calls, and so
  are the sends of the other providers;
* at once, in the caller's thread, for a provider marked ``inline`` (no I/O, e.g. ``null``).

The caller (``Dispatcher._send_all``) starts rows as slots come free and collects results as
they finish, from one queue fed by both kinds of send.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

from notifier import eventloop
from notifier.delivery.outcomes import Attempt, Result
from notifier.models import Notification
from notifier.providers import (
    Permanent,
    Provider,
    Retry,
    can_send_async,
    provider_name,
)
from notifier.settings import Settings

log = logging.getLogger(__name__)

#: Asks a row's guard right before its send: an objection as a result, or None to go ahead.
Guard = Callable[[Notification], Result | None]


class _Ticket:
    """Tells one start of a row's send from another: a late answer of an abandoned send is
    dropped instead of being taken for the answer of the row's next send."""

    __slots__ = ()


#: (row id, ticket, its send, or the exception it raised)
_Finished = tuple[int, _Ticket, Attempt | BaseException]


class Sender:
    """Runs the sends of a worker process's batches and hands back each as a ``Attempt``: its
    result, how long it took, when it ended and the provider that answered. Only ``start``,
    ``wait`` and ``abandon`` are called, from one thread at a time.
    """

    def __init__(self, chains: dict[str, list[Provider]], settings: Settings) -> None:
        self._chains = chains
        self._settings = settings
        self._async_channels = frozenset(
            channel for channel, chain in chains.items() if all(map(can_send_async, chain))
        )
        self._pool: ThreadPoolExecutor | None = None
        self._finished: queue.SimpleQueue[_Finished] = queue.SimpleQueue()
        self._threads: dict[int, _Ticket] = {}  # rows sending in the pool
        self._coroutines: dict[int, _Ticket] = {}  # rows sending on the loop
        # the loop's thread only: each row's task (the rows of one request share theirs)
        self._tasks: dict[int, tuple[_Ticket, asyncio.Task[list[Attempt]]]] = {}
        #: the provider each running send is with, for a send given up on (``abandon``)
        self._using: dict[int, str] = {}

    @property
    def running(self) -> int:
        """Sends started and not yet collected by ``wait``."""
        return len(self._threads) + len(self._coroutines)

    def inline(self, n: Notification) -> bool:
        """Sent at once by the caller: no guard, and a provider that does no I/O."""
        return n.guard is None and self._chains[n.channel][0].inline

    def on_loop(self, n: Notification) -> bool:
        """Sent on the event loop: no guard to ask, and every provider of its chain can."""
        return n.guard is None and n.channel in self._async_channels

    def send_inline(self, n: Notification) -> Attempt:
        return self._in_thread(n, _no_guard)

    def start(self, rows: list[Notification], guard: Guard) -> list[Notification]:
        """Start the sends of ``rows``, in order, as far as free slots go; return the rest.

        On the loop, a slot is one request: rows that their provider may send together
        (``Provider.batch_key``) share one, up to its ``max_batch``."""
        threads = self._settings.send_concurrency - len(self._threads)
        requests = len(set(self._coroutines.values()))  # tickets: one a request under way
        coroutines = self._settings.async_send_concurrency - requests
        later: list[Notification] = []
        on_loop: list[tuple[list[Notification], _Ticket]] = []
        filling: dict[tuple[str, Hashable], tuple[list[Notification], _Ticket]] = {}
        for n in rows:
            if self.on_loop(n):
                key = self._batch_key(n)
                group = None if key is None else filling.get(key)
                if group is not None and len(group[0]) < self._chains[n.channel][0].max_batch:
                    group[0].append(n)
                    self._coroutines[n.id] = group[1]
                    continue
                if coroutines > 0:
                    coroutines -= 1
                    started = ([n], self._track(self._coroutines, n))
                    on_loop.append(started)
                    if key is not None:
                        filling[key] = started
                    continue
            elif threads > 0:
                threads -= 1
                self._start_thread(n, guard)
                continue
            later.append(n)
        if on_loop:  # one wake-up of the loop for the whole wave
            eventloop.get().call_soon_threadsafe(self._spawn, on_loop)
        return later

    def _batch_key(self, n: Notification) -> tuple[str, Hashable] | None:
        """What ``n`` must share with the rows it goes out with, if its provider batches."""
        provider = self._chains[n.channel][0]
        if provider.max_batch <= 1:
            return None
        try:
            key = provider.batch_key(n)
        except Exception:  # a provider bug costs the row its batch, nothing more
            log.exception("provider %s: batch_key raised on notification %d", provider.name, n.id)
            return None
        return None if key is None else (n.channel, key)

    def wait(self, timeout: float) -> dict[int, Attempt]:
        """The results of the sends finished by now, waiting up to ``timeout`` for a first one.

        Re-raises, in the caller's thread, what a send raised outside its providers (a bug, or
        the database lost while rechecking a guarded row), as a failed thread send always did.
        """
        results: dict[int, Attempt] = {}
        try:
            item = self._finished.get(timeout=timeout)
        except queue.Empty:
            return results
        while True:
            self._collect(item, results)
            try:
                item = self._finished.get_nowait()
            except queue.Empty:
                return results

    def abandon(self) -> dict[int, Attempt]:
        """Give up on every send still running, as ``Retry``: it outlived all its timeouts.

        A receiver dripping its answer a byte at a time resets a read timeout for ever. The row
        is retried; a send that did get through is then the counted duplicate, instead of a task
        killed by its time limit with the whole batch's outcomes lost. Sends on the loop are
        cancelled; stuck threads are left to their pool, which is replaced.
        """
        limit = self._settings.longest_send_seconds
        ids = [*self._threads, *self._coroutines]
        log.warning("abandoned %d sends that outlived their timeouts", len(ids))
        if self._threads and self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
        using = {i: self._using.get(i) for i in ids}
        self.drop()
        retry = Retry(f"send still running after {limit:.0f}s; abandoned")
        return {i: Attempt(retry, provider=using[i]) for i in ids}

    def drop(self) -> None:
        """Stop following the sends under way (their batch has failed, or gave up on them):
        those on the loop are cancelled, threads finish unheeded, and no answer is kept."""
        if self._coroutines:
            eventloop.get().call_soon_threadsafe(self._cancel, dict(self._coroutines))
        self._threads.clear()
        self._coroutines.clear()
        self._using.clear()

    def close(self) -> None:
        """Wait for the threads of the pool to finish; a later send starts a new pool."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # -- in the thread pool -----------------------------------------------------------------------

    def _start_thread(self, n: Notification, guard: Guard) -> None:
        ticket = self._track(self._threads, n)
        future = self._executor().submit(self._in_thread, n, guard)
        future.add_done_callback(partial(self._thread_done, n.id, ticket))

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=self._settings.send_concurrency, thread_name_prefix="notifier-send"
            )
        return self._pool

    def _thread_done(self, row_id: int, ticket: _Ticket, future: Future[Attempt]) -> None:
        error = future.exception()
        self._finished.put((row_id, ticket, error if error is not None else future.result()))

    def _in_thread(self, n: Notification, guard: Guard) -> Attempt:
        started = time.perf_counter()
        objection = None if n.guard is None else guard(n)
        if objection is not None:
            return Attempt(objection, *_ended(started))
        result, name = self._through_chain(n)
        return Attempt(result, *_ended(started), name)

    def _through_chain(self, n: Notification) -> tuple[Result, str | None]:
        chain = self._chains[n.channel]
        outcome: Result = Retry("no provider was tried")
        failed: list[str] = []
        name: str | None = None
        for provider in chain:
            name = self._use(n, provider)
            try:
                outcome = provider.send(n)
            except Exception as exc:  # a provider bug must not lose the batch's other outcomes
                outcome = _raised(name, n, exc)
            if not isinstance(outcome, Retry) or provider is chain[-1]:
                break
            failed.append(f"{name}: {outcome.error}")
        return _with_failures(failed, name, outcome), name

    # -- on the event loop ------------------------------------------------------------------------

    def _spawn(self, groups: list[tuple[list[Notification], _Ticket]]) -> None:
        loop = asyncio.get_running_loop()
        for rows, ticket in groups:
            task = loop.create_task(self._on_loop(rows))
            for n in rows:
                self._tasks[n.id] = (ticket, task)
            task.add_done_callback(partial(self._task_done, [n.id for n in rows], ticket))

    def _task_done(
        self, ids: list[int], ticket: _Ticket, task: asyncio.Task[list[Attempt]]
    ) -> None:
        for row_id in ids:
            if self._tasks.get(row_id, (None,))[0] is ticket:
                del self._tasks[row_id]
        if task.cancelled():  # abandoned: its result was decided then
            return
        error = task.exception()
        attempts: list[Attempt | BaseException] = [*task.result()] if error is None else []
        if error is not None:
            attempts = [error] * len(ids)
        for row_id, attempt in zip(ids, attempts, strict=True):
            self._finished.put((row_id, ticket, attempt))

    def _cancel(self, abandoned: dict[int, _Ticket]) -> None:
        for row_id, ticket in abandoned.items():
            ticket_and_task = self._tasks.get(row_id)
            if ticket_and_task is not None and ticket_and_task[0] is ticket:
                ticket_and_task[1].cancel()

    async def _on_loop(self, rows: list[Notification]) -> list[Attempt]:
        """One request's rows, each through its chain: the first provider answers for them all
        at once when there are several (``send_batch_async``), failover goes on row by row."""
        started = time.perf_counter()
        answers: list[Result | None] = [None] * len(rows)
        if len(rows) > 1:
            answers = [*await self._batch(rows)]
        attempts = []
        for n, answer in zip(rows, answers, strict=True):
            result, name = await self._through_chain_async(n, answer)
            attempts.append(Attempt(result, *_ended(started), name))
        return attempts

    async def _batch(self, rows: list[Notification]) -> list[Result | None]:
        """The first provider's answers for ``rows`` in one request; ``None`` for each when it
        raises or miscounts (a bug): every row is then sent on its own."""
        provider = self._chains[rows[0].channel][0]
        try:
            answers = await provider.send_batch_async(rows)
        except Exception:
            log.exception("provider %s raised on a batch of %d", provider_name(provider), len(rows))
            return [None] * len(rows)
        if len(answers) != len(rows):
            name = provider_name(provider)
            log.error("provider %s answered %d of %d rows", name, len(answers), len(rows))
            return [None] * len(rows)
        return list(answers)

    async def _through_chain_async(
        self, n: Notification, answered: Result | None = None
    ) -> tuple[Result, str | None]:
        """``n`` through its chain; ``answered``: the first provider's answer, when it came
        with its request's."""
        chain = self._chains[n.channel]
        outcome: Result = Retry("no provider was tried")
        failed: list[str] = []
        name: str | None = None
        for provider in chain:
            name = self._use(n, provider)
            try:
                if answered is not None and provider is chain[0]:
                    outcome = answered
                else:
                    outcome = await provider.send_async(n)
            except Exception as exc:  # a provider bug must not lose the batch's other outcomes
                outcome = _raised(name, n, exc)
            if not isinstance(outcome, Retry) or provider is chain[-1]:
                break
            failed.append(f"{name}: {outcome.error}")
        return _with_failures(failed, name, outcome), name

    # -- bookkeeping ------------------------------------------------------------------------------

    @staticmethod
    def _track(running: dict[int, _Ticket], n: Notification) -> _Ticket:
        ticket = running[n.id] = _Ticket()
        return ticket

    def _use(self, n: Notification, provider: Provider) -> str:
        name = provider_name(provider)
        self._using[n.id] = name
        return name

    def _collect(self, item: _Finished, results: dict[int, Attempt]) -> None:
        row_id, ticket, send = item
        for running in (self._threads, self._coroutines):
            if running.get(row_id) is ticket:
                del running[row_id]
                self._using.pop(row_id, None)
                if isinstance(send, BaseException):
                    raise send
                results[row_id] = send


def _no_guard(n: Notification) -> Result | None:
    return None


def _raised(name: str, n: Notification, exc: Exception) -> Result:
    """A provider that raises instead of answering met something it cannot handle in this row:
    the row is given up, naming the exception, rather than raising again at every attempt."""
    log.error("provider %s raised on notification %d", name, n.id, exc_info=exc)
    return Permanent(f"{name} provider raised {type(exc).__name__}: {exc}")


def _ended(started: float) -> tuple[float, float]:
    """A send's duration in seconds, and the Unix time it ended."""
    return time.perf_counter() - started, time.time()


def _with_failures(failed: list[str], name: str | None, outcome: Result) -> Result:
    """A chain's last ``Retry`` carries the errors of the providers tried before it."""
    if failed and isinstance(outcome, Retry):
        return Retry("; ".join([*failed, f"{name}: {outcome.error}"]))
    return outcome
