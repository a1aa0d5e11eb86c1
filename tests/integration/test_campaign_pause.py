"""A paused campaign as the commands tell it: ``pause`` and ``status`` count the same rows held
back, and ``status --watch`` watches a paused campaign on until it is done or cancelled."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Engine

from notifier.campaigns import Campaigns
from notifier.db import queue
from tests.commands import run

pytestmark = pytest.mark.usefixtures("restore_logging")

NOTIFIER = str(Path(sys.executable).with_name("notifier"))


def _launched(engine: Engine, n: int) -> Campaigns:
    campaigns = Campaigns(engine)
    campaigns.create("spring", "null", subject="Hi", body="Hello")
    audience = io.StringIO("email\n" + "".join(f"u{i}@example.com\n" for i in range(n)))
    assert campaigns.import_audience("spring", audience, "email") == n
    assert campaigns.launch("spring") == n
    return campaigns


def test_pause_and_status_count_the_same_rows_held_back(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    _launched(engine, 20)
    token = uuid.uuid4()
    with engine.begin() as conn:  # a worker holds 5 rows when the pause comes
        claimed = queue.claim_due(conn, limit=5, lease_seconds=60, token=token, worker="w")
    assert len(claimed) == 5

    code, out, _ = run(capsys, "campaign", "pause", "spring")
    assert code == 0
    assert out == (
        "campaign 'spring': paused; 15 notifications held back; 5 claimed by workers are"
        " handed back unless their send has begun\n"
    )
    with engine.begin() as conn:  # the worker's recheck before its sends hands them back
        held, paused = queue.recheck(conn, token, [n.id for n in claimed])
        assert held == paused == {n.id for n in claimed}
        assert queue.park_claimed(conn, token, paused) == 5

    code, out, _ = run(capsys, "campaign", "status", "spring")
    assert code == 0
    assert "  pending 20  (held back 20)\n" in out
    code, out, _ = run(capsys, "campaign", "status", "spring", "--json")
    data = json.loads(out)
    assert (data["status"], data["held"], data["by_status"]) == ("paused", 20, {"pending": 20})


def test_watch_keeps_watching_a_paused_campaign_until_it_is_cancelled(
    engine: Engine, database_url: str
) -> None:
    campaigns = _launched(engine, 3)
    campaigns.pause("spring")
    watching = subprocess.Popen(
        [NOTIFIER, "campaign", "status", "spring", "--watch"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "NOTIFIER_DATABASE_URL": database_url},
    )
    try:
        time.sleep(3)
        assert watching.poll() is None, watching.communicate()  # still watching
        campaigns.cancel("spring")
        out, err = watching.communicate(timeout=15)
    finally:
        if watching.poll() is None:
            watching.kill()
            watching.wait()
    assert watching.returncode == 0
    assert err.decode().splitlines() == [
        "campaign 'spring' is paused: watching until it is resumed and done, or cancelled"
        " (Ctrl-C stops watching)"
    ]
    assert out.decode().startswith("campaign 'spring' (null): cancelled\n")
