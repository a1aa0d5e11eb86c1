"""A running campaign becomes ``finished`` once it is fully launched and every row is final,
with real rows sent by the dispatcher; and goes back to ``running`` when launched again."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from notifier.campaigns import CampaignError, Campaigns
from notifier.delivery.dispatcher import Dispatcher
from notifier.providers import registry_of
from notifier.providers.null import NullProvider
from notifier.settings import Settings
from tests.migrations import migrate


def _audience(n: int, start: int = 0) -> io.StringIO:
    return io.StringIO("email\n" + "".join(f"u{i}@example.com\n" for i in range(start, start + n)))


@pytest.fixture
def campaigns(engine: Engine) -> Campaigns:
    return Campaigns(engine)


@pytest.fixture
def dispatcher(engine: Engine, settings: Settings) -> Iterator[Dispatcher]:
    sender = Dispatcher(engine, registry_of([NullProvider(Settings())]), settings)
    yield sender
    sender.close()


def _launched(campaigns: Campaigns, n: int, name: str = "spring") -> None:
    campaigns.create(name, "null", body="Your code: {code}")
    campaigns.import_audience(name, _audience(n), "email")
    campaigns.generate_codes(name, n)
    assert campaigns.launch(name) == n


def _drain(dispatcher: Dispatcher) -> None:
    while dispatcher.run_once().claimed:
        pass


def _status(engine: Engine, name: str = "spring") -> str:
    with engine.connect() as conn:
        return str(
            conn.execute(text("SELECT status FROM campaigns WHERE name = :n"), {"n": name}).scalar()
        )


def _sql(engine: Engine, sql: str) -> None:
    with engine.begin() as conn:
        conn.execute(text(sql))


def test_the_sweep_finishes_a_campaign_once_its_last_row_is_final(
    engine: Engine, campaigns: Campaigns, dispatcher: Dispatcher
) -> None:
    _launched(campaigns, 120)  # the dispatcher's batch is 50
    _launched(campaigns, 5, name="other")
    dispatcher.run_once()
    assert campaigns.finish() == []
    assert (_status(engine), _status(engine, "other")) == ("running", "running")
    _drain(dispatcher)
    # one row ends dead, one cancelled: final too
    _sql(
        engine,
        "UPDATE notifications SET status = 'dead', last_error = 'x', sent_at = NULL WHERE id = 1",
    )
    _sql(engine, "UPDATE notifications SET status = 'cancelled', sent_at = NULL WHERE id = 2")
    assert sorted(campaigns.finish()) == ["other", "spring"]
    assert campaigns.finish() == []
    progress = campaigns.status("spring")
    assert (progress.campaign.status, progress.sent, progress.unfinished) == ("finished", 118, 0)


def test_a_row_pending_or_processing_keeps_it_running(
    engine: Engine, campaigns: Campaigns, dispatcher: Dispatcher
) -> None:
    _launched(campaigns, 10)
    _drain(dispatcher)
    _sql(
        engine,
        "UPDATE notifications SET status = 'processing', claim_token = gen_random_uuid(),"
        " locked_until = now() + interval '1 minute', sent_at = NULL WHERE id = 3",
    )
    assert campaigns.finish() == []
    assert campaigns.status("spring").campaign.status == "running"
    _sql(engine, "UPDATE notifications SET status = 'pending', claim_token = NULL WHERE id = 3")
    assert campaigns.finish() == []
    _drain(dispatcher)
    assert campaigns.status("spring").campaign.status == "finished"  # the status read marks it


def test_it_is_not_finished_while_audience_positions_are_unwritten_or_a_launch_runs(
    engine: Engine, campaigns: Campaigns, dispatcher: Dispatcher
) -> None:
    _launched(campaigns, 10)
    _drain(dispatcher)
    campaigns.import_audience("spring", _audience(3, start=10), "email")  # not launched yet
    assert campaigns.finish() == []
    assert campaigns.status("spring").campaign.status == "running"

    campaigns.generate_codes("spring", 3)
    with engine.connect() as launch:  # a launch holds its lock while it writes
        launch.execute(text("SELECT pg_advisory_lock(hashtext('notifier.launch'), 1)"))
        _sql(engine, "INSERT INTO campaign_chunks VALUES (1, 11, 13, 0)")  # as if it wrote them
        assert campaigns.finish() == []
        launch.execute(text("SELECT pg_advisory_unlock(hashtext('notifier.launch'), 1)"))
        launch.commit()
    assert campaigns.finish() == ["spring"]


def test_new_audience_launched_after_the_finish_makes_it_running_again(
    engine: Engine, campaigns: Campaigns, dispatcher: Dispatcher
) -> None:
    _launched(campaigns, 10)
    assert campaigns.launch("spring") == 0  # nothing new: still running, rows to send
    assert _status(engine) == "running"
    _drain(dispatcher)
    assert campaigns.finish() == ["spring"]
    assert campaigns.launch("spring") == 0  # nothing new: finished it stays
    assert _status(engine) == "finished"

    campaigns.import_audience("spring", _audience(4, start=10), "email")
    campaigns.generate_codes("spring", 4)
    assert campaigns.launch("spring") == 4
    assert campaigns.status("spring").campaign.status == "running"
    _drain(dispatcher)
    progress = campaigns.status("spring")
    assert (progress.campaign.status, progress.sent) == ("finished", 14)


@pytest.mark.parametrize("verb", ["pause", "resume", "cancel"])
def test_pause_resume_and_cancel_refuse_a_finished_campaign(
    engine: Engine, campaigns: Campaigns, dispatcher: Dispatcher, verb: str
) -> None:
    _launched(campaigns, 3)
    _drain(dispatcher)
    assert campaigns.status("spring").campaign.status == "finished"
    with pytest.raises(CampaignError) as refused:
        getattr(campaigns, verb)("spring")
    assert str(refused.value) == (
        "campaign 'spring' is finished: every notification was sent, dead or cancelled, so"
        f" there is nothing to {verb}"
    )
    assert _status(engine) == "finished"


def test_downgrading_makes_finished_campaigns_running_again(
    engine: Engine, campaigns: Campaigns, dispatcher: Dispatcher
) -> None:
    _launched(campaigns, 3)
    _drain(dispatcher)
    assert campaigns.finish() == ["spring"]
    migrate(engine, "0016")
    assert _status(engine) == "running"
    with pytest.raises(Exception, match="campaigns_status"):
        _sql(engine, "UPDATE campaigns SET status = 'finished'")
    migrate(engine, "head")
    assert campaigns.finish() == ["spring"]


def test_beat_runs_the_sweep_as_the_finish_campaigns_task(
    campaigns: Campaigns, dispatcher: Dispatcher, redis_url: str
) -> None:
    from celeryconfig import beat_schedule
    from notifier.worker import tasks

    _launched(campaigns, 3)
    assert tasks.finish_campaigns() == []
    _drain(dispatcher)
    assert beat_schedule["finish-campaigns"]["task"] == tasks.finish_campaigns.name
    assert tasks.finish_campaigns() == ["spring"]
