"""The connection budget's arithmetic and verdicts, without a database."""

from __future__ import annotations

from notifier.db.workers import ConnectionLimits
from notifier.worker.budget import Budget, verdict

DEFAULT = ConnectionLimits(max_connections=100, reserved=3, in_use=10)


def test_a_container_counts_its_pool_processes_and_its_main_process() -> None:
    assert Budget(concurrency=4, replicas=1).per_container == 4 * 5 + 2
    assert Budget(concurrency=4, replicas=1, wake_on_insert=False).per_container == 4 * 5
    assert Budget(concurrency=4, replicas=3).needed == 3 * 22 + 7


def test_what_fits_passes_what_nearly_fits_warns_and_what_cannot_fails() -> None:
    assert verdict(Budget(concurrency=2, replicas=2), DEFAULT) is None  # 31 of 97
    level, line = verdict(Budget(concurrency=7, replicas=2), DEFAULT) or ("", "")
    assert level == "warn"  # 81 of 97
    assert "may need 81 of the 97" in line
    level, line = verdict(Budget(concurrency=8, replicas=3), DEFAULT) or ("", "")
    assert level == "fail"
    assert line == (
        "notifier needs 133 database connections (3 worker(s) x (8 processes x 5 + 2) + 7 for"
        " metrics and commands), PostgreSQL allows 97 (max_connections 100 - 3 reserved):"
        " lower --concurrency or NOTIFIER_EXPECTED_WORKERS, or raise PostgreSQL's max_connections"
    )


def test_a_busy_server_warns_even_when_the_arithmetic_fits() -> None:
    busy = ConnectionLimits(max_connections=100, reserved=3, in_use=90)
    level, line = verdict(Budget(concurrency=2, replicas=1), busy) or ("", "")
    assert level == "warn"
    assert line.startswith("90 of the 97 database connections PostgreSQL allows are in use")
