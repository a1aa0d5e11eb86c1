"""The SMTP connections one worker process keeps to one relay, on the event loop.

A send takes an idle connection (the one used last first, so that the ones left over age out)
or opens one, up to the pool's limit, and waits for one to come free past it; it gives the
connection back when its transaction ended cleanly, and retires it otherwise. The pool lives
across batches:

* a connection that carried ``messages_per_connection`` messages is retired (QUIT) and a send
  opens a new one: relays cap the messages of one session, and spreading sessions keeps a
  relay's load balancer balanced;
* an idle connection is checked with ``NOOP`` before use once idle for ``CHECK_IDLE_SECONDS``,
  and retired once idle for ``DROP_IDLE_SECONDS`` (by the next send, or by a sweep while the
  pool has idle connections), before most relays' own idle timeout closes it under a send;
* a relay that refuses us (``421`` "too many connections", a refused or reset connection)
  halves the limit at once (``shrink``), and the limit grows back by one connection every
  ``RECOVER_SECONDS``: the relay's ceiling is found without hammering it.

A retired connection counts towards the limit until its socket is closed, so the relay never
sees more connections from this process than the limit, renewals included.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from notifier.providers.smtp_client import Connection, SmtpError

CHECK_IDLE_SECONDS = 5.0
DROP_IDLE_SECONDS = 30.0
RECOVER_SECONDS = 2.0
#: Refusals that come within this long of a shrink are the same overload: one halving.
SHRINK_HOLD_SECONDS = 1.0


class Limit:
    """The pool's size: ``ceiling`` normally; after a refusal, half of what it was, growing back
    by one every ``RECOVER_SECONDS``. Pure, with the clock passed in."""

    def __init__(self, ceiling: int) -> None:
        self.ceiling = ceiling
        self._shrunk: tuple[int, float] | None = None  # (size, when)

    def now(self, at: float) -> int:
        if self._shrunk is None:
            return self.ceiling
        size, since = self._shrunk
        grown = size + int((at - since) / RECOVER_SECONDS)
        if grown >= self.ceiling:
            self._shrunk = None
            return self.ceiling
        return grown

    def shrink(self, at: float) -> None:
        if self._shrunk is not None and at - self._shrunk[1] < SHRINK_HOLD_SECONDS:
            return
        self._shrunk = (max(1, self.now(at) // 2), at)


class Pool:
    """Connections to one relay, made by ``opener``; use it from its event loop only."""

    def __init__(
        self,
        opener: Callable[[], Awaitable[Connection]],
        ceiling: int,
        messages_per_connection: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._open_one = opener
        self.limit = Limit(ceiling)
        self._per_connection = messages_per_connection
        self._clock = clock
        self._idle: list[tuple[Connection, float]] = []  # (connection, idle since), oldest first
        #: connections open, being opened or being closed: what the relay may see of us
        self.open = 0
        self._waiters: list[asyncio.Future[None]] = []
        self._closing: set[asyncio.Task[None]] = set()
        self._sweeping: asyncio.TimerHandle | None = None
        self.closed = False

    async def take(self) -> tuple[Connection, bool]:
        """A connection ready for a transaction, and whether it was used before (a pooled
        connection the relay dropped shows on its first command, and is worth one fresh try)."""
        while True:
            if self.closed:
                raise SmtpError("the connection pool is shut down")
            while self._idle:
                conn, since = self._idle.pop()
                idle = self._clock() - since
                if conn.broken or conn.unasked or idle >= DROP_IDLE_SECONDS:
                    self._retire(conn, polite=not (conn.broken or conn.unasked))
                    continue
                if idle >= CHECK_IDLE_SECONDS and not await self._alive(conn):
                    continue
                return conn, True
            if self.open < self.limit.now(self._clock()):
                self.open += 1
                try:
                    return await self._open_one(), False
                except BaseException:
                    self.open -= 1
                    self._wake()
                    raise
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # woken, but cancelled before it could take: pass it on
                raise
            finally:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)

    def give_back(self, conn: Connection) -> None:
        """After a clean transaction: keep it, or retire it if it is used up or over the limit."""
        if self.closed or conn.broken or conn.messages >= self._per_connection:
            self._retire(conn, polite=not conn.broken)
        elif self.open > self.limit.now(self._clock()):
            self._retire(conn, polite=True)
        else:
            self._idle.append((conn, self._clock()))
            self._wake()
            self._sweep_later()

    def discard(self, conn: Connection) -> None:
        """After a failure: the connection's state is unknown, close it without a word."""
        self._retire(conn, polite=False)

    def discard_idle(self) -> None:
        """A pooled connection turned out dead: the relay restarted, the others are dead too."""
        idle, self._idle = self._idle, []
        for conn, _ in idle:
            self._retire(conn, polite=False)

    def shrink(self) -> None:
        """The relay refused a connection or a command for overload: fewer connections."""
        self.limit.shrink(self._clock())

    async def close(self) -> None:
        """QUIT the idle connections and wait for every retirement; later takes fail."""
        self.closed = True
        if self._sweeping is not None:
            self._sweeping.cancel()
        idle, self._idle = self._idle, []
        for conn, _ in idle:
            self._retire(conn, polite=True)
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    # -- inside -----------------------------------------------------------------------------------

    async def _alive(self, conn: Connection) -> bool:
        try:
            if await conn.noop():
                return True
        except (SmtpError, OSError, TimeoutError):
            pass
        self._retire(conn, polite=False)
        return False

    def _retire(self, conn: Connection, *, polite: bool) -> None:
        task = asyncio.get_running_loop().create_task(self._close(conn, polite))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _close(self, conn: Connection, polite: bool) -> None:
        try:
            if polite:
                await conn.quit()
            else:
                conn.abort()
            await conn.wait_closed()
        finally:
            self.open -= 1
            self._wake()

    def _wake(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
                return

    def _sweep_later(self) -> None:
        if self._sweeping is None and not self.closed:
            loop = asyncio.get_running_loop()
            self._sweeping = loop.call_later(DROP_IDLE_SECONDS / 2, self._sweep)

    def _sweep(self) -> None:
        """Retire the connections idle for ``DROP_IDLE_SECONDS``; again later while any is idle."""
        self._sweeping = None
        now = self._clock()
        keep = []
        for conn, since in self._idle:
            if conn.broken or now - since >= DROP_IDLE_SECONDS:
                self._retire(conn, polite=not conn.broken)
            else:
                keep.append((conn, since))
        self._idle = keep
        if keep:
            self._sweep_later()
