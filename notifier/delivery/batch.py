"""One batch's bookkeeping: what it came to (``BatchReport``), and the outcomes it has not
recorded yet (``Unrecorded``), which the dispatcher writes in small groups as sends end."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from notifier.delivery.outcomes import Attempt, Plan
from notifier.models import AttemptOutcome, Notification

# The batch line is the dispatcher's, where operators filter for it.
log = logging.getLogger("notifier.delivery.dispatcher")


@dataclass(slots=True)
class BatchReport:
    claimed: int = 0
    sent: int = 0
    retried: int = 0
    dead: int = 0
    cancelled: int = 0
    #: handed back unsent without using up an attempt: stopping, rate-limited, paused, held
    released: int = 0
    #: outcomes that changed nothing: the row was cancelled or rescued meanwhile
    stale: int = 0
    took: float = 0.0
    #: why this batch could not send, when the send gate or the limiter was closed
    paused: str | None = None
    #: the rows of each claim, in order: one, or more when the batch topped itself up
    claims: list[int] = field(default_factory=list)
    #: whether the last claim came back full: a backlog may remain
    full: bool = False

    def claim(self, rows: int, limit: int) -> None:
        self.claims.append(rows)
        self.claimed += rows
        self.full = rows >= limit

    def tally(self, decided: Plan) -> None:
        """Count a group of recorded outcomes."""
        self.sent += decided.count(AttemptOutcome.sent)
        self.dead += decided.count(AttemptOutcome.dead)
        self.retried += decided.count(AttemptOutcome.retry)
        self.cancelled += decided.count(AttemptOutcome.cancelled)
        self.released += decided.count(AttemptOutcome.deferred) + decided.count(AttemptOutcome.held)

    @property
    def done(self) -> int:
        """Rows whose outcome is recorded, or that were handed back."""
        return self.sent + self.retried + self.dead + self.cancelled + self.released + self.stale

    def log(self, worker: str) -> None:
        """The batch's one summary line."""
        log.info(
            "batch claimed=%d sent=%d retried=%d dead=%d cancelled=%d released=%d stale=%d"
            " took=%.3fs",
            self.claimed,
            self.sent,
            self.retried,
            self.dead,
            self.cancelled,
            self.released,
            self.stale,
            self.took,
            extra={
                "event": "batch",
                "claimed": self.claimed,
                "sent": self.sent,
                "retried": self.retried,
                "dead": self.dead,
                "cancelled": self.cancelled,
                "released": self.released,
                "stale": self.stale,
                "took": round(self.took, 3),
                "worker": worker,
            },
        )


#: Outcomes are recorded in groups as sends end: once this many wait, or once the first of
#: them has waited ``RECORD_WITHIN`` seconds. A worker killed mid-batch re-sends at most the
#: group under way (and the sends in flight), not its whole batch; a group costs one short
#: transaction.
RECORD_GROUP = 64
RECORD_WITHIN = 0.025


class Unrecorded:
    """A batch's outcomes not recorded yet, and since when the oldest of them waits."""

    def __init__(self, rows: dict[int, Notification], results: dict[int, Attempt]) -> None:
        self.rows = rows
        self.results = results
        self._since = time.monotonic() if results else None

    def add(self, results: dict[int, Attempt]) -> None:
        if results and self._since is None:
            self._since = time.monotonic()
        self.results.update(results)

    def due(self) -> bool:
        """Whether the group is big or old enough to be recorded now."""
        if self._since is None:
            return False
        waited = time.monotonic() - self._since
        return len(self.results) >= RECORD_GROUP or waited >= RECORD_WITHIN

    def take(self) -> dict[int, Attempt]:
        """The outcomes to record, leaving none."""
        taken, self.results = self.results, {}
        self._since = None
        return taken


#: How long a batch should take at the pace of the last one, when a backlog remains: long enough
#: to claim fast rows by the thousand, short enough that a transactional row claimed by the next
#: batch waits well under a second behind a campaign's.
BATCH_TARGET_SECONDS = 0.5


def claim_size(pace: float, smallest: int, largest: int) -> int:
    """What ``pace`` rows a second send in ``BATCH_TARGET_SECONDS``, between ``smallest`` and
    ``largest`` (``smallest`` when it is the larger)."""
    return max(smallest, min(int(pace * BATCH_TARGET_SECONDS), max(largest, smallest)))


@dataclass(slots=True)
class TopUp:
    """How a batch that came back full goes on claiming while a backlog remains: each time its
    rows are all under way and fewer than ``largest`` sends run, it claims what it sends in
    ``BATCH_TARGET_SECONDS`` at its pace so far (``claim_size``), until ``until`` (a
    ``time.monotonic()`` value) or a claim comes back short. ``on_full`` is called after every
    full claim."""

    smallest: int
    largest: int
    until: float
    on_full: Callable[[], None]
    started: float = field(default_factory=time.monotonic)

    def size(self, report: BatchReport) -> int:
        """The next claim, at the pace of the rows done so far."""
        pace = report.done / max(time.monotonic() - self.started, 0.001)
        return claim_size(pace, self.smallest, self.largest)
