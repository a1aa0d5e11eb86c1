"""One dispatch: claim due rows, send them outside any transaction, record the outcomes in bulk.

No Celery here: the tasks call ``Dispatcher.drain``; tests and benchmarks call it directly.

The life of a batch:

1. ``claim_due`` marks up to ``batch_size`` due rows ``processing`` in one short transaction and
   counts the attempt.
2. Every row is checked (known channel, a JSON-object payload, the provider's ``validate``) and
   sent by its provider, several at a time, with no transaction open.
3. ``plan`` turns the answers into three bulk writes, made in one transaction: ``sent``;
   ``pending`` again after the backoff; ``dead`` with the reason. A write that fails because the
   database went away is retried until it commits, so a send that happened is not forgotten.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from uuid import UUID, uuid4

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import InterfaceError, OperationalError

from notifier import store
from notifier.models import Notification
from notifier.providers import InvalidNotification, Outcome, Permanent, Registry, Retry, Sent
from notifier.providers.base import truncate
from notifier.retry import RetryPolicy, next_attempt_at
from notifier.settings import Settings

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Plan:
    """The writes that record one batch's outcomes."""

    sent: dict[int, str | None] = field(default_factory=dict)
    retries: list[store.RetryAt] = field(default_factory=list)
    dead: dict[int, str] = field(default_factory=dict)


def plan(
    claimed: Sequence[Notification],
    outcomes: dict[int, Outcome],
    policy: RetryPolicy,
    now: datetime,
    rand: Callable[[], float] = random.random,
) -> Plan:
    """Decide each row's next status from its provider's answer. Pure.

    ``Retry`` on the last allowed attempt becomes ``dead``, naming the attempts and the error.
    """
    result = Plan()
    for n in claimed:
        outcome = outcomes[n.id]
        if isinstance(outcome, Sent):
            result.sent[n.id] = outcome.provider_message_id
        elif isinstance(outcome, Permanent):
            result.dead[n.id] = truncate(outcome.error)
        else:
            at = next_attempt_at(
                policy,
                attempts=n.attempts,
                max_attempts=n.max_attempts,
                now=now,
                retry_after=outcome.retry_after,
                rand=rand,
            )
            error = truncate(outcome.error)
            if at is None:
                result.dead[n.id] = f"gave up after {n.attempts} attempts; last error: {error}"
            else:
                result.retries.append(store.RetryAt(n.id, error, at))
    return result


@dataclass(frozen=True, slots=True)
class BatchReport:
    claimed: int
    sent: int
    retried: int
    dead: int
    stale: int
    """Outcomes that changed nothing: the row's lease had expired and it was taken back."""
    took: float
    released: int = 0
    """Claimed rows handed back unsent (stopping, or sending paused), attempts not used up."""
    paused: str | None = None
    """Why this batch could not send, when the send gate was closed."""


class SendingPaused(Exception):
    """Raised by a send gate: nothing may be sent now (e.g. Redis, home of the limits, is down)."""


def _always_open() -> None:
    return


class Dispatcher:
    """Claims, sends and records batches for one worker process.

    ``gate`` is called before every claim and again before the batch's sends; it raises
    ``SendingPaused`` to stop sending (fail closed). Setting ``stopping`` makes the dispatcher
    claim nothing more, let the sends under way finish, and hand the batch's unstarted rows
    back at once.
    """

    def __init__(
        self,
        engine: Engine,
        registry: Registry,
        settings: Settings,
        *,
        worker: str | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        gate: Callable[[], None] = _always_open,
        stopping: threading.Event | None = None,
    ) -> None:
        self.engine = engine
        self.registry = registry
        self.settings = settings
        self.policy = RetryPolicy(
            base=settings.retry_base_seconds,
            cap=settings.retry_max_seconds,
            jitter=settings.retry_jitter,
        )
        self.worker = worker or f"{socket.gethostname()}:{os.getpid()}"
        self.clock = clock
        self.gate = gate
        self.stopping = stopping or threading.Event()
        self._pool: ThreadPoolExecutor | None = None

    # -- public ---------------------------------------------------------------------------------

    def drain(
        self,
        budget_seconds: float | None = None,
        on_full_batch: Callable[[], None] = lambda: None,
    ) -> list[BatchReport]:
        """Run batches while full ones keep coming, for at most ``budget_seconds``.

        ``on_full_batch`` is called after every full batch, so the caller can bring more
        workers in while a backlog remains. Stops early when stopping or paused.
        """
        budget = self.settings.dispatch_budget_seconds if budget_seconds is None else budget_seconds
        deadline = time.monotonic() + budget
        reports = []
        while not self.stopping.is_set():
            report = self.run_once(deadline)
            reports.append(report)
            if (
                report.claimed < self.settings.batch_size
                or report.released
                or report.paused
                or time.monotonic() >= deadline
            ):
                break
            on_full_batch()
        return reports

    def run_once(self, deadline: float | None = None) -> BatchReport:
        """Claim one batch, send it, record what happened.

        Sends not started by ``deadline`` (a ``time.monotonic()`` value; by default the dispatch
        budget from now) are handed back, so a slow provider cannot stretch a task past its
        time limit: a task lasts at most its budget plus one send.
        """
        if deadline is None:
            deadline = time.monotonic() + self.settings.dispatch_budget_seconds
        started = time.monotonic()
        if self.stopping.is_set():
            return BatchReport(0, 0, 0, 0, 0, 0.0)
        try:
            self.gate()
        except SendingPaused as exc:
            log.warning("sending paused, claiming nothing: %s", exc)
            return BatchReport(0, 0, 0, 0, 0, time.monotonic() - started, paused=str(exc))
        token = uuid4()
        with self.engine.begin() as conn:
            claimed = store.claim_due(
                conn,
                limit=self.settings.batch_size,
                lease_seconds=self.settings.lease_seconds,
                token=token,
                worker=self.worker,
            )
        if not claimed:
            return BatchReport(0, 0, 0, 0, 0, time.monotonic() - started)
        try:
            self.gate()
        except SendingPaused as exc:
            log.warning("sending paused, handing %d rows back: %s", len(claimed), exc)
            released = self._release(token, [n.id for n in claimed])
            return BatchReport(
                len(claimed), 0, 0, 0, 0, time.monotonic() - started, released, str(exc)
            )
        try:
            outcomes, released = self._send_all(token, claimed, deadline)
        finally:
            self.registry.close()
        decided = plan(
            [n for n in claimed if n.id in outcomes], outcomes, self.policy, self.clock()
        )
        changed = self._record(token, decided)
        report = BatchReport(
            claimed=len(claimed),
            sent=len(decided.sent),
            retried=len(decided.retries),
            dead=len(decided.dead),
            stale=len(outcomes) - changed,
            took=time.monotonic() - started,
            released=released,
        )
        log.info(
            "batch claimed=%d sent=%d retried=%d dead=%d released=%d stale=%d took=%.3fs",
            report.claimed,
            report.sent,
            report.retried,
            report.dead,
            report.released,
            report.stale,
            report.took,
        )
        return report

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self.registry.close()

    # -- sending --------------------------------------------------------------------------------

    def _send_all(
        self, token: UUID, claimed: Sequence[Notification], deadline: float
    ) -> tuple[dict[int, Outcome], int]:
        """Send concurrently; when stopping or past ``deadline``, hand back unstarted rows."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=self.settings.send_concurrency, thread_name_prefix="notifier-send"
            )
        futures = {self._pool.submit(self._send_one, n): n.id for n in claimed}
        outcomes: dict[int, Outcome] = {}
        released = 0
        waiting: set[Future[Outcome]] = set(futures)
        while waiting:
            done, waiting = wait(waiting, timeout=0.05, return_when=FIRST_COMPLETED)
            for future in done:
                outcomes[futures[future]] = future.result()
            if waiting and (self.stopping.is_set() or time.monotonic() > deadline):
                unstarted = {f for f in waiting if f.cancel()}
                if unstarted:
                    waiting -= unstarted
                    released += self._release(token, [futures[f] for f in unstarted])
        return outcomes, released

    def _send_one(self, n: Notification) -> Outcome:
        provider = self.registry.get(n.channel)
        if provider is None:
            known = ", ".join(sorted(self.registry)) or "none"
            return Permanent(f"unknown channel {n.channel!r}; this deployment serves: {known}")
        try:
            if not isinstance(n.payload, dict):
                raise InvalidNotification(
                    f"payload must be a JSON object, not {type(n.payload).__name__}"
                )
            provider.validate(n)
        except InvalidNotification as exc:
            return Permanent(f"invalid notification: {exc}")
        try:
            return provider.send(n)
        except Exception as exc:  # a provider bug must not lose the batch's other outcomes
            log.exception("provider %s raised on notification %d", n.channel, n.id)
            return Retry(f"{n.channel} provider raised {type(exc).__name__}: {exc}")

    # -- recording ------------------------------------------------------------------------------

    def _release(self, token: UUID, ids: list[int]) -> int:
        return self._write(lambda conn: store.release(conn, token, ids))

    def _record(self, token: UUID, decided: Plan) -> int:
        return self._write(
            lambda conn: (
                store.mark_sent(conn, token, decided.sent)
                + store.schedule_retry(conn, token, decided.retries)
                + store.mark_dead(conn, token, decided.dead)
            )
        )

    def _write(self, statements: Callable[[Connection], int]) -> int:
        """Run one transaction of outcome writes, retrying until it commits.

        Gives up only when the lease has run out: by then the rescue owns the rows.
        """
        deadline = time.monotonic() + self.settings.lease_seconds
        delay = 0.1
        while True:
            try:
                with self.engine.begin() as conn:
                    return statements(conn)
            except (OperationalError, InterfaceError) as exc:  # connection lost, db restarting
                if time.monotonic() + delay >= deadline:
                    raise
                log.warning("recording outcomes failed (%s); retrying in %.1fs", exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
