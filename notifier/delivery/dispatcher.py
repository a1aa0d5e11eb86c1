"""One dispatch: claim due rows, send them outside any transaction, record the outcomes in bulk.

No Celery here: the tasks call ``Dispatcher.drain``; tests and benchmarks call it directly.

The life of a batch:

1. ``claim_due`` marks up to ``batch_size`` due rows ``processing`` in one short transaction and
   counts the attempt.
2. Just before sending, rows cancelled since the claim are dropped and rows of a paused campaign
   are handed back. Every other row is checked (known channel, a JSON-object payload within the
   limits, the provider's ``validate``) and may not have expired.
3. The provider's rate limits grant what they can now; the rest go back to ``pending`` for as
   long as the limiter says, without using up their attempt.
4. The rest pass their guard, if they name one, and are sent by their provider, several at a
   time, with no transaction open: many at once on the event loop for providers that can send
   asynchronously (webhooks), a few at a time in threads for the others (see ``sender``).
5. ``outcomes.plan`` turns the answers into bulk writes, in small groups as sends end. A write
   that fails because the database went away is retried until it commits, so a send that
   happened is not forgotten.
6. While a backlog remains (every claim came back full), the batch claims more each time its
   rows are all under way (``batch.TopUp``): the next rows are claimed while the last are sent.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TypeVar
from uuid import UUID, uuid4

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from notifier.delivery import guards as guards_module
from notifier.delivery.batch import (
    BATCH_TARGET_SECONDS,
    BatchReport,
    TopUp,
    Unrecorded,
    claim_size,
)
from notifier.delivery.caps import FrequencyCaps
from notifier.delivery.checks import RowCheck
from notifier.delivery.claims import Claims
from notifier.delivery.outcomes import Attempt, Result, explain, plan
from notifier.delivery.pacing import Pacing, SendingPaused
from notifier.delivery.prepare import Content, prepare_each
from notifier.delivery.ratelimit import Limiter, NoLimits
from notifier.delivery.recorder import Recorder
from notifier.delivery.retry import RetryPolicy
from notifier.delivery.sender import Sender
from notifier.models import AttemptOutcome, Decision, Notification
from notifier.providers import Registry, chains
from notifier.settings import Settings

__all__ = ["BATCH_TARGET_SECONDS", "RECHECK_AFTER", "Dispatcher", "SendingPaused", "process_name"]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Seconds after which rows about to be sent are looked at again (cancelled? paused?).
RECHECK_AFTER = 0.2


def _always_open() -> None:
    return


class Dispatcher:
    """Claims, sends and records batches for one worker process.

    ``gate`` is called before every claim; it raises ``SendingPaused`` to stop sending (fail
    closed), as does the limiter when it cannot be asked. Setting ``stopping`` makes the
    dispatcher claim nothing more, let the sends under way finish, and hand the batch's
    unstarted rows back at once.
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
        limiter: Limiter | None = None,
        observe: Callable[[list[Decision]], None] = lambda decisions: None,
        content: Content | None = None,
        caps: FrequencyCaps | None = None,
    ) -> None:
        self.engine = engine
        self.registry = registry
        self.settings = settings
        self.policy = RetryPolicy(
            base=settings.retry_base_seconds,
            cap=settings.retry_max_seconds,
            jitter=settings.retry_jitter,
        )
        self.worker = worker or process_name()
        self.clock = clock
        self.stopping = stopping or threading.Event()
        self.guards = guards if guards is not None else guards_module.registry_of([])
        self.observe = observe
        self.content = content if content is not None else Content(engine, settings)
        self._claims = Claims(engine, settings, self.worker)
        self._chains = chains(registry, settings.failover)
        self._sender = Sender(self._chains, settings)
        self._check = RowCheck(self._chains, settings, clock)
        self._pacing = Pacing(limiter or NoLimits(), self._chains, gate)
        self._caps = caps if caps is not None else FrequencyCaps(None, {})
        history_by = self.worker if settings.record_attempts else None
        self._recorder = Recorder(engine, history_by, within=settings.lease_seconds)

    # -- public ---------------------------------------------------------------------------------

    def drain(
        self,
        budget_seconds: float | None = None,
        on_full_batch: Callable[[], None] = lambda: None,
    ) -> list[BatchReport]:
        """Run batches while full ones keep coming, for at most ``budget_seconds``.

        ``on_full_batch`` is called after every full claim, so the caller can bring more
        workers in while a backlog remains. A full batch goes on claiming as its sends get under
        way (``TopUp``), so that the next rows are claimed while the last ones are sent. Stops
        early when stopping or paused.
        """
        budget = self.settings.dispatch_budget_seconds if budget_seconds is None else budget_seconds
        deadline = time.monotonic() + budget
        reports = []
        limit = self.settings.batch_size
        while not self.stopping.is_set():
            report = self.run_once(deadline, limit=limit, on_full=on_full_batch)
            reports.append(report)
            if not report.full or report.paused or time.monotonic() >= deadline:
                break
            limit = self.next_limit(report)
        return reports

    def next_limit(self, full: BatchReport) -> int:
        """The claim after a full batch: what this process sent in ``BATCH_TARGET_SECONDS`` at
        that batch's pace, between ``batch_size`` and ``max_batch_size``."""
        pace = full.claimed / max(full.took, 0.001)
        return claim_size(pace, self.settings.batch_size, self.settings.max_batch_size)

    def run_once(
        self,
        deadline: float | None = None,
        *,
        limit: int | None = None,
        on_full: Callable[[], None] | None = None,
    ) -> BatchReport:
        """Claim one batch, send it, record what happened. With ``on_full``, a full claim
        calls it and the batch tops itself up while a backlog remains (``TopUp``).

        Sends not started by ``deadline`` (a ``time.monotonic()`` value; by default the dispatch
        budget from now) are handed back, so a slow provider cannot stretch a task past its
        time limit: a task lasts at most its budget plus one send.
        """
        started = time.monotonic()
        deadline = started + self.settings.dispatch_budget_seconds if deadline is None else deadline
        report = BatchReport()
        if self.stopping.is_set():
            return report
        try:
            self._pacing.gate()
        except SendingPaused as exc:
            log.warning("sending paused, claiming nothing: %s", exc)
            report.paused = str(exc)
            return report
        token, limit = uuid4(), self.settings.batch_size if limit is None else limit
        claimed = self._claims.claim(token, limit)
        report.claim(len(claimed), limit)
        if claimed:
            top_up = None
            if on_full is not None and report.full:
                on_full()
                top_up = self._top_up(deadline, on_full)
            self._process(token, claimed, deadline, report, top_up)
            report.took = time.monotonic() - started
            report.log(self.worker)
        return report

    def _top_up(self, deadline: float, on_full: Callable[[], None]) -> TopUp:
        s = self.settings
        largest = max(s.max_batch_size, s.batch_size)
        until = deadline - BATCH_TARGET_SECONDS  # rows claimed later would be handed back
        return TopUp(s.batch_size, largest, until, on_full)

    def close(self) -> None:
        """Release everything: the send threads, and what providers and guards keep open,
        including connection pools kept across batches (a worker process stopping, tests)."""
        self._sender.close()
        self.registry.close()
        for provider in self.registry.values():
            provider.shutdown()
        self.guards.close()

    # -- the stages of a batch ------------------------------------------------------------------

    def _process(
        self,
        token: UUID,
        claimed: list[Notification],
        deadline: float,
        report: BatchReport,
        top_up: TopUp | None,
    ) -> None:
        unrecorded = Unrecorded({}, {})
        ready = self._ready(token, claimed, report, unrecorded)
        try:
            self._send_all(token, ready, deadline, unrecorded, report, top_up)
            self._record(token, unrecorded, report)
        except BaseException:  # the batch is lost, its rows left to the rescue: so are its sends
            self._sender.drop()
            raise
        finally:
            self.registry.close()

    def _ready(
        self,
        token: UUID,
        claimed: list[Notification],
        report: BatchReport,
        unrecorded: Unrecorded,
    ) -> list[Notification]:
        """The claimed rows still to send, prepared and checked; the others' results (a row
        that cannot be sent) join ``unrecorded``."""
        # Looked at again right before sending: a producer may have cancelled since the claim;
        # the suppression list's entries for the rows are read in the same round trip.
        rows, stopped = self._claims.first_look(token, claimed, report)
        # Templates rendered, suppressed recipients and staging overrides applied.
        prepared, results = prepare_each(self.content, rows, self._durably, stopped)
        ready: list[Notification] = []
        for n in prepared:
            early = self._check(n)
            if early is None:
                ready.append(n)
            else:
                results[n.id] = early
        if self._caps:  # each person's frequency caps, last: only rows about to go count
            ready, capped = self._caps.admit(ready, self.clock())
            results.update(capped)
        if any(n.to_devices for n in ready):  # to a person's devices, one row each: not sent here
            self._claims.fan_out(token, [n for n in ready if n.to_devices], report)
            ready = [n for n in ready if not n.to_devices]
        unrecorded.rows.update((n.id, n) for n in rows)
        unrecorded.add({i: Attempt(result) for i, result in results.items()})
        return ready

    def _more(
        self, token: UUID, top_up: TopUp, report: BatchReport, unrecorded: Unrecorded
    ) -> list[Notification] | None:
        """The next rows of a batch that tops itself up, ready to send; ``None`` when it stops:
        past its time, stopping or paused. A claim that came back short (``report.full``
        false) is the last."""
        if self.stopping.is_set() or time.monotonic() >= top_up.until:
            return None
        try:
            self._pacing.gate()
        except SendingPaused as exc:
            log.warning("sending paused, claiming nothing more: %s", exc)
            report.paused = str(exc)
            return None
        limit = top_up.size(report)
        try:
            claimed = self._claims.claim(token, limit)
        except DBAPIError as exc:  # the sends under way must still be recorded: stop claiming
            log.warning("could not claim more for this batch: %s", exc)
            return None
        report.claim(len(claimed), limit)
        if report.full:
            top_up.on_full()
        return self._ready(token, claimed, report, unrecorded)

    def _record(self, token: UUID, unrecorded: Unrecorded, report: BatchReport) -> None:
        """Decide and record the outcomes not recorded yet, in one transaction."""
        sends = unrecorded.take()
        if not sends:
            return
        attempted = [unrecorded.rows[i] for i in sends]
        decided = plan(
            attempted,
            sends,
            self.policy,
            self.clock(),
            max_deferrals=self.settings.max_deferrals,
            overrides=self.content.overrides,
        )
        self._pacing.block(decided.throttled)
        if self._caps:
            unsent = [d.id for d in decided.decisions if d.outcome is not AttemptOutcome.sent]
            self._caps.release([unrecorded.rows[i] for i in unsent])
        changed = self._recorder.record(token, decided)
        report.stale += len(sends) - changed
        self.observe(decided.decisions)
        explain(attempted, decided, log)
        report.tally(decided)

    def _durably(self, statements: Callable[[Connection], T]) -> T:
        return self._claims.durably(statements)

    def _send_all(
        self,
        token: UUID,
        rows: list[Notification],
        deadline: float,
        unrecorded: Unrecorded,
        report: BatchReport,
        top_up: TopUp | None = None,
    ) -> None:
        """Attempt ``rows`` as fast as the rate limits allow, several at a time, recording their
        outcomes in small groups as they come (``RECORD_GROUP``, ``RECORD_WITHIN``); with
        ``top_up``, claim more each time they are all under way (``_more``).

        Rows the limits hold back wait here, paced by the limiter, until the deadline. Sends
        start in waves as slots come free (``sender.Sender``); before a wave that starts more
        than ``RECHECK_AFTER`` seconds after the last look, its rows are looked at again, so a
        row cancelled (or its campaign paused) while its batch was sending is not sent. When
        stopping, past the deadline, or when the limiter cannot be asked (fail closed), the rows
        not yet started are handed back without using up their attempt; sends under way finish.
        Sends still running ``longest_send_seconds`` after the deadline are abandoned.

        Recording as the sends end, not once per batch, keeps the duplicate window small: a
        worker killed mid-batch leaves unrecorded only the sends of the group under way, which
        the rescue hands out again (counted in ``rescues``).
        """
        sender = self._sender
        waiting = rows  # not yet granted by the rate limits
        ready: list[Notification] = []  # granted, not yet started
        looked = time.monotonic()
        overdue = deadline + self.settings.longest_send_seconds
        while waiting or ready or sender.running or top_up is not None:
            pause = 0.05
            closing = self.stopping.is_set() or time.monotonic() >= deadline
            if top_up is not None and not (waiting or ready):
                if closing:
                    top_up = None
                elif sender.running < top_up.largest:
                    more = self._more(token, top_up, report, unrecorded)
                    # after a short claim the backlog is claimed: that one was the last
                    top_up = top_up if more is not None and report.full else None
                    waiting = more or []
                    looked = time.monotonic()  # the claim's rows were looked at just now
            if waiting and not closing:
                try:
                    waiting = self._not_held(token, waiting, report)
                    granted, waiting, pause = self._pacing.grant(waiting)
                    ready += granted
                except SendingPaused as exc:
                    log.warning("sending paused, handing rows back: %s", exc)
                    report.paused = str(exc)
                    closing = True
            if closing and (waiting or ready):
                report.released += self._claims.release(token, [n.id for n in waiting + ready])
                waiting, ready = [], []
            if ready and time.monotonic() - looked > RECHECK_AFTER:
                ready = self._claims.still_wanted(token, ready, report)
                looked = time.monotonic()
            ready = self._start(token, ready, unrecorded)
            if sender.running:
                unrecorded.add(sender.wait(pause))
                if sender.running and time.monotonic() > overdue:
                    unrecorded.add(sender.abandon())
            elif waiting and not ready:
                self.stopping.wait(min(pause, max(deadline - time.monotonic(), 0.0)))
            if unrecorded.due():
                self._record(token, unrecorded, report)

    def _start(
        self, token: UUID, ready: list[Notification], unrecorded: Unrecorded
    ) -> list[Notification]:
        """Attempt the inline rows at once and start the others as slots allow; return the rest."""
        if ready and self._sender.inline(ready[0]):
            sent = {}
            for n in ready:  # no I/O: not worth a thread, and done at once
                if self._sender.inline(n):
                    sent[n.id] = self._sender.send_inline(n)
            unrecorded.add(sent)
            ready = [n for n in ready if n.id not in sent]
        return self._sender.start(ready, lambda n: self._ask_guard(token, n))

    def _not_held(
        self, token: UUID, waiting: list[Notification], report: BatchReport
    ) -> list[Notification]:
        """``waiting`` without the rows whose receiver asked every worker to wait (a webhook's
        429): those are handed back, due when the hold ends, without using up an attempt."""
        rest, holds = self._pacing.held_back(waiting)
        now = self.clock()
        for seconds, ids in holds.items():
            report.released += self._claims.release(
                token,
                ids,
                not_before=now + timedelta(seconds=seconds),
                reason="its receiver asked every worker to wait (HTTP 429)",
            )
        return rest

    def _ask_guard(self, token: UUID, n: Notification) -> Result | None:
        """The guard's objection as a result, or ``None`` if the row may be sent now."""
        objection = guards_module.objection(self.guards, n)
        if objection is not None:
            return objection
        return self._claims.after_guard(token, n)


def process_name() -> str:
    """``hostname:pid:nonce``, written into ``claimed_by``: one process, for as long as it
    lives. The nonce tells apart a process from its predecessor with the same PID, as in a
    restarted container, so the dead one's rows are not taken for the living one's."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
