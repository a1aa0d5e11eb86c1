"""One dispatch: claim due rows, send them outside any transaction, record the outcomes in bulk.

No Celery here: the tasks call ``Dispatcher.drain``; tests and benchmarks call it directly.

The life of a batch:

1. ``claim_due`` marks up to ``batch_size`` due rows ``processing`` in one short transaction and
   counts the attempt.
2. Just before sending, rows cancelled since the claim are dropped. Every other row is checked
   (known channel, a JSON-object payload within the limits, the provider's ``validate``), may
   not have expired, must pass its guard if it names one, and is sent by its provider, several
   at a time, with no transaction open.
3. ``plan`` turns the answers into bulk writes, made in one transaction: ``sent``; ``pending``
   again after the backoff; ``dead`` or ``cancelled`` with the reason. A write that fails because
   the database went away is retried until it commits, so a send that happened is not forgotten.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TypeVar
from uuid import UUID, uuid4

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import InterfaceError, OperationalError

from notifier import guards as guards_module
from notifier import store
from notifier.guards import GuardError, Skip
from notifier.models import Notification
from notifier.providers import InvalidNotification, Outcome, Permanent, Registry, Retry, Sent
from notifier.providers.base import truncate
from notifier.retry import RetryPolicy, next_attempt_at
from notifier.settings import Settings
from notifier.validation import check_common

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Cancelled:
    """Not sent, for good, by notifier's own decision: expired, or its guard said no."""

    reason: str


#: What became of one row's attempt: a provider's answer, or cancelled before the provider.
Result = Outcome | Cancelled


@dataclass(slots=True)
class Plan:
    """The writes that record one batch's outcomes."""

    sent: dict[int, str | None] = field(default_factory=dict)
    retries: list[store.RetryAt] = field(default_factory=list)
    dead: dict[int, str] = field(default_factory=dict)
    cancelled: dict[int, str] = field(default_factory=dict)


def plan(
    claimed: Sequence[Notification],
    outcomes: Mapping[int, Result],
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
        elif isinstance(outcome, Cancelled):
            result.cancelled[n.id] = truncate(outcome.reason)
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
    cancelled: int = 0
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
        guards: guards_module.Registry | None = None,
    ) -> None:
        self.engine = engine
        self.registry = registry
        self.guards = guards if guards is not None else guards_module.registry_of([])
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
                len(claimed), 0, 0, 0, 0, time.monotonic() - started, 0, released, str(exc)
            )
        # Checked again right before sending: a producer may have cancelled since the claim.
        held = self._write(lambda conn: store.still_held(conn, token, (n.id for n in claimed)))
        try:
            outcomes, released = self._send_all(
                token, [n for n in claimed if n.id in held], deadline
            )
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
            cancelled=len(decided.cancelled),
            stale=len(claimed) - len(held) + len(outcomes) - changed,
            took=time.monotonic() - started,
            released=released,
        )
        log.info(
            "batch claimed=%d sent=%d retried=%d dead=%d cancelled=%d released=%d stale=%d"
            " took=%.3fs",
            report.claimed,
            report.sent,
            report.retried,
            report.dead,
            report.cancelled,
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
        self.guards.close()

    # -- sending --------------------------------------------------------------------------------

    def _send_all(
        self, token: UUID, claimed: Sequence[Notification], deadline: float
    ) -> tuple[dict[int, Result], int]:
        """Send concurrently; when stopping or past ``deadline``, hand back unstarted rows."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=self.settings.send_concurrency, thread_name_prefix="notifier-send"
            )
        futures = {self._pool.submit(self._send_one, token, n): n.id for n in claimed}
        outcomes: dict[int, Result] = {}
        released = 0
        waiting: set[Future[Result]] = set(futures)
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

    def _send_one(self, token: UUID, n: Notification) -> Result:
        provider = self.registry.get(n.channel)
        if provider is None:
            known = ", ".join(sorted(self.registry)) or "none"
            return Permanent(f"unknown channel {n.channel!r}; this deployment serves: {known}")
        try:
            if not isinstance(n.payload, dict):
                raise InvalidNotification(
                    f"payload must be a JSON object, not {type(n.payload).__name__}"
                )
            check_common(n, self.settings)
            provider.validate(n)
        except InvalidNotification as exc:
            return Permanent(f"invalid notification: {exc}")
        if n.expires_at is not None and self.clock() >= n.expires_at:
            return Cancelled("expired")
        if n.guard is not None:
            verdict = self._ask_guard(token, n)
            if verdict is not None:
                return verdict
        try:
            return provider.send(n)
        except Exception as exc:  # a provider bug must not lose the batch's other outcomes
            log.exception("provider %s raised on notification %d", n.channel, n.id)
            return Retry(f"{n.channel} provider raised {type(exc).__name__}: {exc}")

    def _ask_guard(self, token: UUID, n: Notification) -> Result | None:
        """The guard's objection as a result, or ``None`` if the row may be sent now."""
        guard = self.guards.get(n.guard or "")
        if guard is None:
            known = ", ".join(sorted(self.guards)) or "none"
            return Permanent(f"unknown guard {n.guard!r}; this deployment has: {known}")
        try:
            verdict = guard.check(n)
        except GuardError as exc:
            return Retry(f"guard {n.guard}: {exc}")
        except Exception as exc:  # a guard bug is not a reason to send
            log.exception("guard %s raised on notification %d", n.guard, n.id)
            return Retry(f"guard {n.guard} raised {type(exc).__name__}: {exc}")
        if isinstance(verdict, Skip):
            return Cancelled(verdict.reason)
        # Asking took time: look once more that nobody cancelled the row meanwhile.
        if n.id not in self._write(lambda conn: store.still_held(conn, token, [n.id])):
            return Cancelled("cancelled while its guard was consulted")
        return None

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

    def _write(self, statements: Callable[[Connection], T]) -> T:
        """Run one transaction of writes (or the recheck before sending), retrying until it commits.

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
