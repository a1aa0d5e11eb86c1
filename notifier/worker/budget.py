"""The PostgreSQL connections a deployment can open, against what the server allows.

What one worker container can hold at most:

* each pool process (``--concurrency`` of them): its engine's pool, ``POOL_SIZE`` +
  ``POOL_OVERFLOW`` (the dispatcher, and guards' re-checks from send threads), plus its
  heartbeat's connection;
* the main process: the wake-up listener's ``LISTEN`` connection and the one its re-reads
  borrow from the main process's engine (none with ``NOTIFIER_WAKE_ON_INSERT=false``).

Beat and Flower open none. Besides the workers there is ``notifier metrics`` (an engine's pool)
and the short-lived commands: healthchecks, ``notifier migrate``, operators' commands.
"""

from __future__ import annotations

from dataclasses import dataclass

from notifier.db import POOL_OVERFLOW, POOL_SIZE
from notifier.db.workers import ConnectionLimits

#: One pool process: its engine at most, and its heartbeat.
PER_POOL_PROCESS = POOL_SIZE + POOL_OVERFLOW + 1
#: The main process: the LISTEN connection and one for the re-reads of the table.
MAIN_PROCESS = 2
#: ``notifier metrics`` (an engine's pool) and a few commands at once (healthchecks, migrate).
OUTSIDE_WORKERS = POOL_SIZE + POOL_OVERFLOW + 3
#: Above this share of what PostgreSQL allows, a worker starts with a warning.
WARN_AT = 0.8


@dataclass(frozen=True, slots=True)
class Budget:
    """The connections ``replicas`` worker containers of ``concurrency`` processes can open."""

    concurrency: int
    replicas: int
    wake_on_insert: bool = True

    @property
    def per_container(self) -> int:
        return self.concurrency * PER_POOL_PROCESS + (MAIN_PROCESS if self.wake_on_insert else 0)

    @property
    def needed(self) -> int:
        return self.replicas * self.per_container + OUTSIDE_WORKERS

    def arithmetic(self) -> str:
        main = MAIN_PROCESS if self.wake_on_insert else 0
        return (
            f"{self.replicas} worker(s) x ({self.concurrency} processes x {PER_POOL_PROCESS}"
            f" + {main}) + {OUTSIDE_WORKERS} for metrics and commands"
        )


def verdict(budget: Budget, limits: ConnectionLimits) -> tuple[str, str] | None:
    """``("fail" | "warn", one line)`` when the deployment does not fit, or nearly; else None."""
    allowed = limits.allowed
    fix = "lower --concurrency or NOTIFIER_EXPECTED_WORKERS, or raise PostgreSQL's max_connections"
    where = (
        f"PostgreSQL allows {allowed} (max_connections {limits.max_connections}"
        f" - {limits.reserved} reserved)"
    )
    if budget.needed > allowed:
        return "fail", (
            f"notifier needs {budget.needed} database connections ({budget.arithmetic()}),"
            f" {where}: {fix}"
        )
    if budget.needed > WARN_AT * allowed:
        return "warn", (
            f"notifier may need {budget.needed} of the {allowed} database connections"
            f" PostgreSQL allows ({budget.arithmetic()}); close to the limit: {fix}"
        )
    if limits.in_use + budget.per_container > allowed:
        return "warn", (
            f"{limits.in_use} of the {allowed} database connections PostgreSQL allows are in use"
            f" and this worker may open {budget.per_container} more: {fix}"
        )
    return None
