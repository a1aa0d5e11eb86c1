"""A misspelt setting stops every notifier process at start, with one line naming it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.acceptance.conftest import REPO

TYPO = "unknown setting NOTIFIER_RATE_LIMIT; did you mean NOTIFIER_RATE_LIMITS?"


@pytest.mark.parametrize(
    ("command", "exit_code", "says"),
    [
        (["-m", "notifier.cli", "stats"], 2, f"notifier: {TYPO}"),
        (["-m", "celery", "-A", "notifier", "worker"], 1, f"notifier: {TYPO}"),
        (["-m", "celery", "-A", "notifier", "beat"], 1, f"notifier: {TYPO}"),
    ],
    ids=["cli", "worker", "beat"],
)
def test_a_misspelt_setting_stops_the_process(
    command: list[str], exit_code: int, says: str
) -> None:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "VIRTUAL_ENV")}
    # Nothing listens there: the process must stop before it tries to connect.
    env.update(
        NOTIFIER_DATABASE_URL="postgresql://postgres@127.0.0.1:1/none",
        NOTIFIER_REDIS_URL="redis://127.0.0.1:1/0",
        NOTIFIER_RATE_LIMIT="email=10/s",
    )
    done = subprocess.run(
        [sys.executable, *command], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stderr.splitlines()) == (exit_code, [says]), done.stdout
