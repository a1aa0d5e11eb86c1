"""A campaign's cancel is final: for rows written before it, by a launch under way, and later;
and a campaign sent and purged is never written again."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

from notifier import ops
from notifier.campaigns import CampaignError, Campaigns
from notifier.settings import Settings
from tests.migrations import migrate

WAIT_SECONDS = 30.0


def _audience(n: int, start: int = 0) -> io.StringIO:
    rows = "".join(f"user{i}@example.com\n" for i in range(start, start + n))
    return io.StringIO("email\n" + rows)


def _prepare(campaigns: Campaigns, n: int) -> None:
    campaigns.create("spring", "null", subject="Hi", body="Your code: {code}")
    campaigns.import_audience("spring", _audience(n), "email")
    campaigns.generate_codes("spring", n)


def _by_status(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT status, count(*) FROM notifications GROUP BY status")
        ).all()
    return {str(status): int(n) for status, n in rows}


def _lock_waits(engine: Engine) -> int:
    """Sessions of this test's database waiting for a lock."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
                    " WHERE NOT l.granted AND a.datname = current_database()"
                )
            ).scalar_one()
        )


def _wait_until(done: Callable[[], bool], what: str) -> None:
    """Poll a condition on the database's lock table; fail, not hang, if it never comes."""
    deadline = time.monotonic() + WAIT_SECONDS
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.01)


def test_a_cancel_during_a_launch_cancels_the_chunk_being_written_and_stops_the_rest(
    engine: Engine,
) -> None:
    campaigns = Campaigns(engine)
    _prepare(campaigns, 20)
    # The launch and the cancel use up the engine's pool: the test watches on its own.
    observer = create_engine(engine.url, poolclass=NullPool)
    with observer.connect() as conn:
        campaign_id, second_chunks = conn.execute(
            text("SELECT campaign_id, recipient FROM campaign_recipients WHERE position = 6")
        ).one()
    # An uncommitted row for a recipient of the second chunk: that chunk's INSERT waits on it,
    # so the chunk is under way (its status checked, its rows not committed) for as long as we
    # hold it.
    blocker = observer.connect()
    blocker.execute(
        text(
            "INSERT INTO notifications (channel, recipient, campaign_id) VALUES ('null', :r, :id)"
        ),
        {"r": second_chunks, "id": campaign_id},
    )
    first_chunk = threading.Event()
    failures: list[BaseException] = []

    def launch() -> None:
        try:
            campaigns.launch("spring", lambda n: first_chunk.set(), chunk=5, parallel=1)
        except BaseException as exc:  # handed to the test thread
            failures.append(exc)

    def cancel() -> None:
        campaigns.cancel("spring")

    launcher = threading.Thread(target=launch)
    launcher.start()
    try:
        assert first_chunk.wait(WAIT_SECONDS), "the first chunk was never committed"
        _wait_until(lambda: _lock_waits(observer) >= 1, "the second chunk to wait on the row")
        canceller = threading.Thread(target=cancel)
        canceller.start()
        # The cancel waits for the chunk under way (or, without that wait, is over at once).
        _wait_until(
            lambda: not canceller.is_alive() or _lock_waits(observer) >= 2,
            "the cancel to wait for the chunk under way",
        )
    finally:
        blocker.rollback()
        blocker.close()
        observer.dispose()
    canceller.join(WAIT_SECONDS)
    launcher.join(WAIT_SECONDS)
    assert not canceller.is_alive()
    assert not launcher.is_alive()

    assert _by_status(engine) == {"cancelled": 10}  # the first two chunks, none after
    [failure] = failures
    assert isinstance(failure, CampaignError)
    assert "was cancelled while it launched" in str(failure)


def test_a_cancelled_campaign_cannot_launch_again(engine: Engine) -> None:
    campaigns = Campaigns(engine)
    _prepare(campaigns, 10)
    assert campaigns.cancel("spring") == 0  # before its launch
    with pytest.raises(CampaignError, match="was cancelled, which is final: it cannot launch"):
        campaigns.launch("spring")
    assert _by_status(engine) == {}


def _send_and_purge(engine: Engine, settings: Settings) -> None:
    with engine.begin() as conn:  # sent 40 days ago: past the 30 days' retention
        conn.execute(
            text(
                "UPDATE notifications SET status = 'sent',"
                " sent_at = now() - interval '40 days', updated_at = now() - interval '40 days'"
            )
        )
    assert ops.purge(engine, settings).deleted["sent"] > 0
    assert _by_status(engine) == {}


def test_a_campaign_sent_and_purged_is_not_written_again(
    engine: Engine, settings: Settings
) -> None:
    campaigns = Campaigns(engine)
    _prepare(campaigns, 23)
    assert campaigns.launch("spring", chunk=10) == 23
    _send_and_purge(engine, settings)

    assert campaigns.launch("spring", chunk=10) == 0
    assert _by_status(engine) == {}
    # Recipients added since are still reached, and only they.
    campaigns.import_audience("spring", _audience(2, start=100), "email")
    campaigns.generate_codes("spring", 2)
    assert campaigns.launch("spring", chunk=7) == 2
    with engine.connect() as conn:
        recipients = conn.execute(text("SELECT recipient FROM notifications ORDER BY 1")).scalars()
        assert list(recipients) == ["user100@example.com", "user101@example.com"]


def test_campaigns_launched_before_the_upgrade_are_not_written_again_after_a_purge(
    engine: Engine, settings: Settings
) -> None:
    campaigns = Campaigns(engine)
    _prepare(campaigns, 12)
    migrate(engine, "0008")
    with engine.begin() as conn:  # launched the old way: rows, and no record of the chunks
        conn.execute(
            text(
                "INSERT INTO notifications (channel, recipient, campaign_id)"
                " SELECT 'null', recipient, campaign_id FROM campaign_recipients"
            )
        )
        conn.execute(text("UPDATE campaigns SET status = 'running'"))
    migrate(engine, "head")
    _send_and_purge(engine, settings)
    assert campaigns.launch("spring") == 0
