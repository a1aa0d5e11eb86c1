"""Campaigns against a real PostgreSQL: fan-out, codes, re-runs, a killed launch, pause, cancel."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, TextClause, text

from notifier.campaigns import CampaignError, Campaigns
from notifier.db import launches
from notifier.delivery.dispatcher import Dispatcher
from notifier.providers import load_registry
from notifier.settings import Settings, get_settings
from tests.factories import MakeRow
from tests.migrations import migrate

AUDIENCE = 50_000


def _csv(n: int, start: int = 0) -> io.StringIO:
    rows = "".join(f"user{i}@example.com,User {i}\n" for i in range(start, start + n))
    return io.StringIO("email,name\n" + rows)


def _one(engine: Engine, sql: str) -> tuple[object, ...]:
    with engine.connect() as conn:
        return tuple(conn.execute(text(sql)).one())


# Notifications whose code is the one at their recipient's position in the pool.
_PAIRED = """
    SELECT count(*) FROM notifications AS n
      JOIN campaign_recipients AS r ON r.campaign_id = n.campaign_id AND r.recipient = n.recipient
      JOIN campaign_codes AS k ON k.campaign_id = r.campaign_id AND k.position = r.position
     WHERE n.payload ->> 'code' = k.code
"""


@pytest.fixture
def campaigns(engine: Engine) -> Campaigns:
    return Campaigns(engine)


def _prepare(campaigns: Campaigns, name: str = "spring", n: int = AUDIENCE) -> None:
    campaigns.create(name, "null", subject="Hi {name}", body="Your code: {code}")
    assert campaigns.import_audience(name, _csv(n), "email") == n
    assert campaigns.generate_codes(name, n) == n


def test_every_recipient_gets_one_row_and_one_distinct_code(
    engine: Engine, campaigns: Campaigns
) -> None:
    _prepare(campaigns)
    assert campaigns.launch("spring", chunk=7_000, parallel=3) == AUDIENCE
    assert campaigns.launch("spring", chunk=7_000) == 0  # a re-run writes nothing

    rows, recipients, codes, mismatched = _one(
        engine,
        "SELECT count(*), count(DISTINCT recipient), count(DISTINCT payload->>'code'),"
        " count(*) FILTER (WHERE body <> 'Your code: ' || (payload->>'code'))"
        " FROM notifications WHERE campaign_id IS NOT NULL",
    )
    assert (rows, recipients, codes, mismatched) == (AUDIENCE, AUDIENCE, AUDIENCE, 0)
    assert _one(engine, _PAIRED) == (AUDIENCE,)
    assert _one(
        engine, "SELECT subject FROM notifications WHERE recipient = 'user7@example.com'"
    ) == ("Hi User 7",)
    status = campaigns.status("spring")
    assert status.campaign.status == "running"
    assert status.counts.notifications == AUDIENCE


def test_two_launches_at_once_write_each_row_once(engine: Engine, campaigns: Campaigns) -> None:
    _prepare(campaigns, n=20_000)
    written: list[int] = []
    errors: list[BaseException] = []

    def launch() -> None:
        try:
            written.append(campaigns.launch("spring", chunk=2_000))
        except BaseException as exc:  # reported below
            errors.append(exc)

    launches = [threading.Thread(target=launch) for _ in range(2)]
    for t in launches:
        t.start()
    for t in launches:
        t.join(60)
    assert errors == []
    assert sum(written) == 20_000
    assert _one(engine, _PAIRED) == (20_000,)


def test_new_recipients_after_a_launch_get_their_row_on_the_next_run(
    engine: Engine, campaigns: Campaigns
) -> None:
    _prepare(campaigns, n=1_000)
    campaigns.launch("spring")
    campaigns.import_audience("spring", _csv(500, start=1_000), "email")
    with pytest.raises(CampaignError, match="500 recipients still need a code but only 0"):
        campaigns.launch("spring")
    campaigns.generate_codes("spring", 500)
    assert campaigns.launch("spring") == 500
    assert _one(engine, "SELECT count(DISTINCT payload->>'code') FROM notifications") == (1_500,)


def test_a_launch_killed_half_way_is_finished_by_running_it_again(
    engine: Engine, campaigns: Campaigns, database_url: str, tmp_path: Path
) -> None:
    _prepare(campaigns, n=AUDIENCE)
    env = {**os.environ, "NOTIFIER_DATABASE_URL": database_url}
    launch = subprocess.Popen(
        [sys.executable, "-c", _SLOW_LAUNCH],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert launch.stdout is not None
    assert launch.stdout.readline().strip() == "chunk written"  # a first chunk has committed
    os.kill(launch.pid, signal.SIGKILL)
    launch.wait(timeout=10)
    launch.stdout.close()
    assert launch.returncode == -signal.SIGKILL
    (half,) = _one(engine, "SELECT count(*) FROM notifications")
    assert 0 < int(half) < AUDIENCE  # type: ignore[call-overload]

    campaigns.launch("spring")
    rows, recipients, codes = _one(
        engine,
        "SELECT count(*), count(DISTINCT recipient), count(DISTINCT payload->>'code')"
        " FROM notifications",
    )
    assert (rows, recipients, codes) == (AUDIENCE, AUDIENCE, AUDIENCE)
    assert _one(engine, _PAIRED) == (AUDIENCE,)


@pytest.mark.parametrize(
    ("probe", "index"),
    [
        (launches.ADDRESS_WRITTEN, "notifications_campaign_recipient"),
        (launches.PROFILE_WRITTEN, "notifications_campaign_profile"),
    ],
)
def test_the_look_for_a_chunk_s_rows_can_use_its_unique_index(
    engine: Engine, probe: TextClause, index: str
) -> None:
    # A re-run looks for each recipient's row in every chunk without a record: through the
    # partial unique index that is one probe a recipient, without it a scan of the table each.
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL enable_seqscan = off"))
        params = {"id": 1, "after": 0, "upto": 5_000}
        plan = "\n".join(conn.execute(text(f"EXPLAIN {probe.text}"), params).scalars())
    assert index in plan, plan


# Launches in chunks of 5,000, announcing the first committed chunk, then slowly goes on.
_SLOW_LAUNCH = """
import sys, time
from notifier import db
from notifier.campaigns import Campaigns
first = True
def progress(n):
    global first
    if first:
        print("chunk written", flush=True)
        first = False
    time.sleep(0.5)
Campaigns(db.engine()).launch("spring", progress, chunk=5000)
"""


def test_positions_stay_dense_across_imports_and_repeats(
    engine: Engine, campaigns: Campaigns
) -> None:
    campaigns.create("dense", "null", body="{code}")
    first = io.StringIO("email,name\nb@x.org,B\na@x.org,A\nb@x.org,B again\n ,nobody\n")
    assert campaigns.import_audience("dense", first, "email") == 2
    second = io.StringIO("email,name\nc@x.org,C\na@x.org,A\n")
    assert campaigns.import_audience("dense", second, "email") == 1
    assert campaigns.import_codes("dense", ["K2", "K1", "K2", "", "K3", "K4"]) == 4
    assert campaigns.import_codes("dense", ["K4", "K5"]) == 1
    recipients = _all(engine, "SELECT position, recipient FROM campaign_recipients ORDER BY 1")
    assert recipients == [(1, "a@x.org"), (2, "b@x.org"), (3, "c@x.org")]
    codes = _all(engine, "SELECT position, code FROM campaign_codes ORDER BY 1")
    assert codes == [(1, "K1"), (2, "K2"), (3, "K3"), (4, "K4"), (5, "K5")]
    assert campaigns.launch("dense") == 3
    assert _all(engine, "SELECT recipient, body FROM notifications ORDER BY 1") == [
        ("a@x.org", "K1"),
        ("b@x.org", "K2"),
        ("c@x.org", "K3"),
    ]
    counts = campaigns.status("dense").counts
    assert (counts.recipients, counts.codes, counts.codes_given) == (3, 5, 3)


def test_upgrading_keeps_the_codes_already_given(engine: Engine) -> None:
    """Before positions, codes were given by writing the recipient on the code: those pairs
    stay, free codes fill the recipients still without one, then follow the last recipient."""
    migrate(engine, "0007")
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO campaigns (id, name, channel) VALUES (7, 'old', 'null')"))
        conn.execute(
            text(
                "INSERT INTO campaign_recipients (campaign_id, recipient) VALUES"
                " (7, 'a@x.org'), (7, 'b@x.org'), (7, 'c@x.org'), (7, 'd@x.org')"
            )
        )
        conn.execute(
            text(
                "INSERT INTO campaign_codes (campaign_id, code, recipient) VALUES"
                " (7, 'Z9', 'a@x.org'), (7, 'A1', 'c@x.org'), (7, 'M5', NULL), (7, 'B2', NULL),"
                " (7, 'Q7', NULL)"
            )
        )
    migrate(engine, "head")
    pairs = _all(
        engine,
        "SELECT r.recipient, k.code FROM campaign_codes k LEFT JOIN campaign_recipients r"
        " USING (campaign_id, position) ORDER BY k.position",
    )
    assert pairs == [
        ("a@x.org", "Z9"),
        ("b@x.org", "B2"),
        ("c@x.org", "A1"),
        ("d@x.org", "M5"),
        (None, "Q7"),
    ]
    migrate(engine, "0007")
    given = _all(engine, "SELECT code, recipient FROM campaign_codes ORDER BY code")
    assert given == [("A1", None), ("B2", None), ("M5", None), ("Q7", None), ("Z9", None)]


def _all(engine: Engine, sql: str) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(text(sql))]


def test_a_field_missing_for_a_recipient_stops_the_launch_before_anything_is_written(
    engine: Engine, campaigns: Campaigns
) -> None:
    campaigns.create("typo", "null", body="Hello {first_name}")
    campaigns.import_audience("typo", _csv(10), "email")
    with pytest.raises(
        CampaignError, match=r"has no value for 'first_name', which the template uses"
    ):
        campaigns.launch("typo")
    assert _one(engine, "SELECT count(*) FROM notifications") == (0,)


@pytest.mark.parametrize("template", ["{code!r}", "{code:>5}", "{0}", "{a.b}", "oops {"])
def test_templates_refuse_anything_but_plain_placeholders(
    campaigns: Campaigns, template: str
) -> None:
    with pytest.raises(CampaignError):
        campaigns.create("bad", "null", body=template)


def test_csv_problems_are_explained(campaigns: Campaigns) -> None:
    campaigns.create("c", "null", body="hi")
    with pytest.raises(ValueError, match="no 'email' column"):
        campaigns.import_audience("c", io.StringIO("mail,name\nx,y\n"), "email")
    with pytest.raises(ValueError, match="line 3 has 1 values; the header has 2"):
        campaigns.import_audience("c", io.StringIO("email,name\na@x.org,A\nb@x.org\n"), "email")


def test_audience_from_a_query(engine: Engine, campaigns: Campaigns) -> None:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE users (email text, name text, confirmed bool)"))
        conn.execute(
            text(
                "INSERT INTO users SELECT 'u' || i || '@example.com', 'U' || i, i % 2 = 0"
                " FROM generate_series(1, 100) AS i"
            )
        )
        conn.execute(text("GRANT SELECT ON users TO notifier_audience"))
    campaigns.create("q", "null", subject="Hi {name}")
    added = campaigns.audience_from_query(
        "q", "SELECT email AS recipient, name FROM users WHERE confirmed"
    )
    assert added == 50
    assert campaigns.launch("q") == 50
    assert _one(engine, "SELECT subject FROM notifications WHERE recipient = 'u2@example.com'") == (
        "Hi U2",
    )


def test_pause_holds_rows_back_and_resume_lets_them_go(
    engine: Engine, campaigns: Campaigns, settings: Settings
) -> None:
    _prepare(campaigns, n=300)
    campaigns.launch("spring")
    dispatcher = Dispatcher(engine, load_registry(get_settings()), settings)
    dispatcher.run_once()  # 50 sent
    assert campaigns.pause("spring").held == 250
    for _ in range(3):
        assert dispatcher.run_once().sent == 0
    assert campaigns.status("spring").sent == 50

    assert campaigns.resume("spring") == 250
    while dispatcher.run_once().claimed:
        pass
    dispatcher.close()
    assert campaigns.status("spring").sent == 300


def test_rows_of_a_campaign_paused_after_their_claim_are_handed_back(
    engine: Engine, campaigns: Campaigns, settings: Settings
) -> None:
    _prepare(campaigns, n=10)
    campaigns.launch("spring")
    with engine.begin() as conn:  # the campaign pauses between a worker's claim and its sends
        conn.execute(text("UPDATE campaigns SET status = 'paused'"))
    report = Dispatcher(engine, load_registry(get_settings()), settings).run_once()
    assert (report.claimed, report.sent, report.released) == (10, 0, 10)
    assert _one(
        engine,
        "SELECT count(*), max(attempts), bool_and(next_attempt_at = 'infinity')"
        " FROM notifications WHERE status = 'pending'",
    ) == (10, 0, True)


def test_cancel_stops_every_unsent_row(engine: Engine, campaigns: Campaigns) -> None:
    _prepare(campaigns, n=100)
    campaigns.launch("spring")
    assert campaigns.cancel("spring") == 100
    assert _one(engine, "SELECT count(*) FROM notifications WHERE status = 'cancelled'") == (100,)
    with pytest.raises(CampaignError, match="cannot launch"):
        campaigns.launch("spring")


def test_an_urgent_row_overtakes_the_campaign_backlog(
    engine: Engine, campaigns: Campaigns, settings: Settings, make_row: MakeRow
) -> None:
    _prepare(campaigns, n=2_000)
    campaigns.launch("spring")
    make_row(channel="null", recipient="ann@example.com", subject="Reset your password")
    time.sleep(0.01)
    Dispatcher(engine, load_registry(get_settings()), settings).run_once()
    assert _one(engine, "SELECT status FROM notifications WHERE recipient = 'ann@example.com'") == (
        "sent",
    )
