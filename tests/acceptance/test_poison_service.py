"""One row never hurts another, against running worker and beat processes and real receivers.

Each hostile row here once stopped every worker, killed its batch or made good rows go out
again; now each ends alone with a reason, and every good row beside it is delivered once.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from tests.acceptance.conftest import Services, unfinished, wait_for
from tests.receiver import Receiver
from tests.smtp_sink import SmtpSink

ENCODED_BCC = "=?utf-8?q?Hi=0D=0ABcc:_eve@evil.example?="


@pytest.fixture
def receivers(services: Services) -> Iterator[tuple[Receiver, Receiver]]:
    good, hostile = Receiver().start(), Receiver().start()
    hostile.answers["/nul"] = (500, {}, b"broken\x00\x1b[2J body")
    hostile.answers["/busy"] = (429, {"Retry-After": "1"}, b"slow down")
    services.env.update(
        NOTIFIER_WEBHOOK_ALLOW_HTTP="true",
        NOTIFIER_WEBHOOK_ALLOWED_NETWORKS="127.0.0.0/8",
        NOTIFIER_MAX_DEFERRALS="2",
        NOTIFIER_MAX_BODY_BYTES="100000",
    )
    yield good, hostile
    good.stop()
    hostile.stop()


@pytest.mark.timeout(180)
def test_hostile_rows_end_alone_beside_good_ones(
    engine: Engine,
    services: Services,
    smtp_sink: SmtpSink,
    receivers: tuple[Receiver, Receiver],
) -> None:
    good, hostile = receivers
    deep = "[" * 5000 + "]" * 5000
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO notifications (channel, recipient, subject, body)"
                " SELECT 'null', 'good-' || i, NULL, NULL FROM generate_series(1, 20) i"
                " UNION ALL SELECT 'email', 'user' || i || '@example.com', 'Hello', 'Hi'"
                "   FROM generate_series(1, 10) i"
                " UNION ALL SELECT 'webhook', :good || '?n=' || i, NULL, NULL"
                "   FROM generate_series(1, 10) i"
            ),
            {"good": good.url},
        )
        conn.execute(
            text(
                "INSERT INTO suppressions (channel, recipient, reason) VALUES (:c, :r, 'opt-out')"
            ),
            {"c": "email", "r": "ann@example.com"},
        )
        hostile_rows = [
            ("never expires", "null", "x", None, None, "{}", "infinity", 5),
            ("too deep", "null", "x", None, None, json.dumps({"a": 1})[:-1] + f', "d": {deep}}}',
             None, 5),
            ("bad url", "webhook", "https://[::1/", None, None, "{}", None, 5),
            ("nul answer", "webhook", hostile.base() + "/nul", None, None, "{}", None, 2),
            ("busy receiver", "webhook", hostile.base() + "/busy", None, None, "{}", None, 5),
            ("encoded bcc", "email", "victim@example.com", ENCODED_BCC, "x", "{}", None, 5),
            ("suppressed", "email", "Ann@Example.COM", "Offer", "x", "{}", None, 5),
            ("huge body", "email", "big@example.com", "Big", "b" * 200_000, "{}", None, 5),
        ]  # fmt: skip
        conn.execute(
            text(
                "INSERT INTO notifications (dedupe_key, channel, recipient, subject, body,"
                " payload, expires_at, max_attempts) VALUES (:key, :channel, :recipient,"
                " :subject, :body, CAST(:payload AS jsonb), CAST(:expires AS timestamptz), :max)"
            ),
            [
                dict(
                    zip(
                        (
                            "key",
                            "channel",
                            "recipient",
                            "subject",
                            "body",
                            "payload",
                            "expires",
                            "max",
                        ),
                        row,
                        strict=True,
                    )
                )
                for row in hostile_rows
            ],
        )

    services.worker(concurrency=2)
    services.beat()
    wait_for(lambda: unfinished(engine) == 0, 150, "every row to end")

    with engine.connect() as conn:
        good_rows = conn.execute(
            text(
                "SELECT status, attempts, count(*) FROM notifications WHERE dedupe_key IS NULL"
                " GROUP BY 1, 2"
            )
        ).all()
        ended = {
            key: (status, error)
            for key, status, error in conn.execute(
                text(
                    "SELECT dedupe_key, status, last_error FROM notifications"
                    " WHERE dedupe_key IS NOT NULL"
                )
            ).all()
        }
    assert [tuple(r) for r in good_rows] == [("sent", 1, 40)]
    assert sorted(good.counts().values()) == [1] * 10  # each good webhook once
    assert ended["never expires"] == ("sent", None)
    assert ended["too deep"][0] == "dead"
    assert "nested too deeply" in str(ended["too deep"][1])
    assert ended["bad url"][0] == "dead"
    assert "malformed" in str(ended["bad url"][1])
    status, error = ended["nul answer"]
    assert status == "dead"
    assert "HTTP 500" in str(error)
    assert str(error).isprintable()
    assert ended["busy receiver"][0] == "dead"
    assert "asked to slow down 3 times" in str(ended["busy receiver"][1])
    assert ended["suppressed"] == ("cancelled", "suppressed: opt-out")
    assert ended["huge body"][0] == "dead"
    assert "NOTIFIER_MAX_BODY_BYTES" in str(ended["huge body"][1])
    assert hostile.paths()["/nul"] == 2  # both attempts made; no good row went out twice
    # No header was added: the encoded words arrive as the literal subject, or not at all.
    for received in smtp_sink.messages:
        assert received.message["Bcc"] is None
    recipients = Counter(r for m in smtp_sink.messages for r in m.rcpt_tos)
    assert "ann@example.com" not in {r.lower() for r in recipients}
    assert all(count == 1 for count in recipients.values())
