"""Pacing a batch's sends by the limits every worker shares (``ratelimit``): which rows may
start now, which wait and for how long, and which a receiver asked every worker to hold back.

No database here: the dispatcher hands back the rows pacing holds. Whatever stops the limiter
from answering stops the sending (``SendingPaused``: fail closed), as does the send gate.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable

from notifier.delivery.ratelimit import Limiter
from notifier.models import Notification
from notifier.providers import Provider

log = logging.getLogger(__name__)

#: Shortest wait before asking the rate limiter again: at 500/s the next token is 2 ms away, and
#: asking that often takes one token per round trip to Redis; 20 ms takes about ten.
LIMITER_PACE = 0.02
#: The longest pause between two looks at the limits while rows wait.
LONGEST_PAUSE = 0.05


class SendingPaused(Exception):
    """Nothing may be sent now (e.g. Redis, home of the rate limits, is unreachable)."""


class Pacing:
    """One worker process's view of the shared limits: ``gate`` is asked before every grant
    and raises ``SendingPaused`` to stop sending."""

    def __init__(
        self,
        limiter: Limiter,
        chains: dict[str, list[Provider]],
        gate: Callable[[], None],
    ) -> None:
        self.limiter = limiter
        self.chains = chains
        self.gate = gate

    def grant(
        self, waiting: list[Notification]
    ) -> tuple[list[Notification], list[Notification], float]:
        """Ask the limiter for every channel in ``waiting``: (granted, still waiting, how long
        to wait before asking again)."""
        self.gate()  # whatever the limits, nothing is sent while the gate is closed
        by_channel: dict[str, list[Notification]] = defaultdict(list)
        for n in waiting:
            by_channel[n.channel].append(n)
        granted: list[Notification] = []
        rest: list[Notification] = []
        pause = LONGEST_PAUSE
        for channel, group in by_channel.items():
            try:
                count, wait_seconds = self.limiter.acquire(channel, len(group))
            except Exception as exc:
                raise SendingPaused(f"rate limiter unavailable ({exc})") from exc
            granted += group[:count]
            if count < len(group):
                rest += group[count:]
                pause = min(pause, max(wait_seconds, LIMITER_PACE))
        return granted, rest, pause

    def held_back(
        self, waiting: list[Notification]
    ) -> tuple[list[Notification], dict[float, list[int]]]:
        """``waiting`` without the rows whose receiver asked every worker to wait (a webhook's
        429), and those rows' ids by the seconds the hold has left."""
        scopes: dict[int, str] = {}
        for n in waiting:
            scope = self.chains[n.channel][0].throttle_scope(n)
            if scope is not None:
                scopes[n.id] = scope
        if not scopes:
            return waiting, {}
        try:
            held = self.limiter.held(sorted(set(scopes.values())))
        except Exception as exc:
            raise SendingPaused(f"rate limiter unavailable ({exc})") from exc
        if not held:
            return waiting, {}
        holds: dict[float, list[int]] = defaultdict(list)
        for row_id, scope in scopes.items():
            if scope in held:
                holds[held[scope]].append(row_id)
        return [n for n in waiting if scopes.get(n.id) not in held], dict(holds)

    def block(self, throttled: dict[str, float]) -> None:
        """Hold every worker back from each scope that asked to slow down, for as long as it
        asked."""
        for scope, seconds in throttled.items():
            try:
                self.limiter.block(scope, seconds)
            except Exception:  # the rows are deferred anyway; this only spares the receiver
                log.warning("could not hold %s back for %.0fs in the limiter", scope, seconds)
