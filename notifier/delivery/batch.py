"""One batch's bookkeeping: what it came to (``BatchReport``), and the outcomes it has not
recorded yet (``Unrecorded``), which the dispatcher writes in small groups as sends end."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from notifier.delivery.outcomes import Attempt
from notifier.models import Notification

# The batch line is the dispatcher's, where operators filter for it.
log = logging.getLogger("notifier.delivery.dispatcher")


@dataclass(slots=True)
class BatchReport:
    claimed: int = 0
    sent: int = 0
    retried: int = 0
    dead: int = 0
    cancelled: int = 0
    #: handed back unsent without using up an attempt: stopping, rate-limited, paused
    released: int = 0
    #: outcomes that changed nothing: the row was cancelled or rescued meanwhile
    stale: int = 0
    took: float = 0.0
    #: why this batch could not send, when the send gate or the limiter was closed
    paused: str | None = None

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
