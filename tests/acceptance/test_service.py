"""The service end to end: rows inserted with SQL, delivered by real worker and beat processes.

Beat ticks every second here; everything else is as in production.
"""

from __future__ import annotations

import itertools
from collections import Counter

from sqlalchemy import Engine, text

from tests.acceptance.conftest import Services, unfinished, wait_for
from tests.smtp_sink import SmtpSink


def _scalar(engine: Engine, sql: str) -> object:
    with engine.connect() as conn:
        return conn.execute(text(sql)).scalar()


def test_rows_inserted_with_sql_are_delivered_once(
    engine: Engine, smtp_sink: SmtpSink, services: Services
) -> None:
    smtp_sink.rcpt_replies["nobody@example.com"] = "550 5.1.1 <nobody@example.com>: no such user"
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO notifications (channel, recipient, subject, body)"
                " SELECT 'email', 'user' || i || '@example.com', 'Hello ' || i, 'Body ' || i"
                " FROM generate_series(1, 200) AS i"
            )
        )
        conn.execute(
            text(
                "INSERT INTO notifications (channel, recipient, subject) VALUES"
                " ('email', 'nobody@example.com', 'bounce'), ('carrier-pigeon', 'x', 'lost')"
            )
        )
    services.worker()
    services.beat()
    wait_for(lambda: unfinished(engine) == 0, 60, "every row to be finished")

    with engine.connect() as conn:
        by_status = dict(
            conn.execute(text("SELECT status, count(*) FROM notifications GROUP BY 1")).all()
        )
        dead = dict(
            conn.execute(
                text("SELECT recipient, last_error FROM notifications WHERE status = 'dead'")
            ).all()
        )
        attempts = conn.execute(text("SELECT max(attempts) FROM notifications")).scalar()
    assert by_status == {"sent": 200, "dead": 2}
    assert attempts == 1
    assert dead["nobody@example.com"] == "SMTP 550 5.1.1 <nobody@example.com>: no such user"
    assert "unknown channel 'carrier-pigeon'" in dead["x"]
    per_recipient = Counter(r for m in smtp_sink.messages for r in m.rcpt_tos)
    assert len(per_recipient) == 200
    assert set(per_recipient.values()) == {1}


def test_transient_rejections_back_off_then_give_up(
    engine: Engine, smtp_sink: SmtpSink, services: Services
) -> None:
    smtp_sink.rcpt_replies["busy@example.com"] = "451 4.3.0 mailbox busy, try later"
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO notifications (channel, recipient, subject, max_attempts)"
                " VALUES ('email', 'busy@example.com', 'retry me', 4)"
            )
        )
    services.worker()
    services.beat()
    wait_for(lambda: unfinished(engine) == 0, 60, "the row to be given up")

    with engine.connect() as conn:
        status, attempts, error = conn.execute(
            text("SELECT status, attempts, last_error FROM notifications")
        ).one()
    assert (status, attempts) == ("dead", 4)
    assert error == "gave up after 4 attempts; last error: SMTP 451 4.3.0 mailbox busy, try later"
    times = [t for address, t in smtp_sink.rcpt_attempts if address == "busy@example.com"]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert len(times) == 4
    # base 1 s doubling with 20 % jitter, seen through a 1 s beat: roughly 1, 2, 4 seconds.
    assert gaps[0] >= 0.8
    assert gaps[1] >= 1.6
    assert gaps[2] >= 3.2
    assert gaps[2] > gaps[0]


def test_two_workers_and_two_beats_send_each_row_once(
    engine: Engine, smtp_sink: SmtpSink, services: Services
) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO notifications (channel, recipient, subject)"
                " SELECT 'email', 'user' || i || '@example.com', 'n' || i"
                " FROM generate_series(1, 1000) AS i"
            )
        )
    services.worker("w1")
    services.worker("w2")
    services.beat("beat1")
    services.beat("beat2")
    wait_for(lambda: unfinished(engine) == 0, 90, "every row to be sent")

    claimed_by = _scalar(engine, "SELECT count(DISTINCT claimed_by)::int FROM notifications")
    assert _scalar(engine, "SELECT count(*) FROM notifications WHERE status = 'sent'") == 1000
    per_recipient = Counter(r for m in smtp_sink.messages for r in m.rcpt_tos)
    assert len(per_recipient) == 1000
    assert set(per_recipient.values()) == {1}
    assert isinstance(claimed_by, int)
    assert claimed_by >= 2  # both workers took part


def test_a_worker_says_at_start_which_channels_cannot_send(
    engine: Engine, services: Services
) -> None:
    """No Twilio or FCM settings here: the worker's log says so when it starts, before any row
    for those channels exists, naming the settings to set."""
    for name in list(services.env):
        if name.startswith(("NOTIFIER_TWILIO_", "NOTIFIER_FCM_")):
            del services.env[name]
    services.worker()
    wait_for(
        lambda: (
            "channel push cannot send" in services.log("w1")
            and "channel sms cannot send" in services.log("w1")
        ),
        60,
        "the worker's start-up report",
    )
    log = services.log("w1")
    assert "channel sms cannot send: SMS is not configured: set NOTIFIER_TWILIO_ACCOUNT_SID" in log
    assert (
        "channel push cannot send: push is not configured: set NOTIFIER_FCM_CREDENTIALS_FILE" in log
    )
    assert "channel email cannot send" not in log
