"""Rows that a provider may send together go out in one request, through the dispatcher, with
one outcome each: against loopback servers of Postmark's and SendGrid's published formats."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from notifier.delivery.dispatcher import Dispatcher
from notifier.providers import registry_of
from notifier.providers.postmark import PostmarkProvider
from notifier.providers.sendgrid import SendGridProvider
from tests.esp_servers import EspServer, running
from tests.factories import MakeRows, MakeSettings
from tests.integration.test_esp_providers import configured


@pytest.fixture
def servers() -> Iterator[tuple[EspServer, EspServer]]:
    with running("postmark") as postmark, running("sendgrid") as sendgrid:
        yield postmark, sendgrid
        assert postmark.violations == []
        assert sendgrid.violations == []


def _dispatcher(
    engine: Engine,
    make_settings: MakeSettings,
    servers: tuple[EspServer, EspServer],
    **more: object,
) -> Dispatcher:
    postmark, sendgrid = servers
    settings = make_settings(
        **{
            **configured("postmark", postmark.url).model_dump(include={"postmark_server_token"}),
            **configured("sendgrid", sendgrid.url).model_dump(include={"sendgrid_api_key"}),
            "postmark_api_base": postmark.url,
            "sendgrid_api_base": sendgrid.url,
            "email_from": "Shop <news@shop.example>",
            **more,
        }
    )
    providers = [PostmarkProvider(settings), SendGridProvider(settings)]
    return Dispatcher(engine, registry_of(providers), settings)


def _rows(engine: Engine) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                text(
                    "SELECT n.status, n.attempts, n.provider, a.provider, a.outcome,"
                    " n.provider_message_id IS NOT NULL FROM notifications n"
                    " JOIN notification_attempts a ON a.notification_id = n.id ORDER BY n.id"
                )
            )
        ]


def test_a_batch_of_rows_goes_out_in_one_request_with_one_outcome_each(
    engine: Engine, make_settings: MakeSettings, make_rows: MakeRows, servers: tuple[EspServer, ...]
) -> None:
    postmark, _ = servers
    ids = make_rows(
        300,
        channel="email",
        recipient=lambda i: f"u{i}@example.com",
        subject="Hi",
        body="Use SPRING.",
    )
    dispatcher = _dispatcher(
        engine, make_settings, servers, failover="email=postmark", batch_size=300
    )
    report = dispatcher.run_once()
    dispatcher.close()

    assert report.sent == 300
    assert len(postmark.requests) == 1  # not 300
    assert [p.path for p in postmark.requests] == ["/email/batch"]
    seen = Counter(m["metadata"]["notifier-id"] for m in postmark.messages)
    assert seen == Counter({str(i): 1 for i in ids})  # every row once
    assert set(_rows(engine)) == {("sent", 1, "postmark", "postmark", "sent", True)}


def test_a_batch_the_first_provider_refuses_fails_over_row_by_row(
    engine: Engine, make_settings: MakeSettings, make_rows: MakeRows, servers: tuple[EspServer, ...]
) -> None:
    postmark, sendgrid = servers
    postmark.answers.append((503, {"Content-Type": "application/json"}, b'{"Message": "down"}'))
    make_rows(
        20,
        channel="email",
        recipient=lambda i: f"u{i}@example.com",
        subject="Hi",
        body="Use SPRING.",
    )
    dispatcher = _dispatcher(engine, make_settings, servers, failover="email=postmark,sendgrid")
    report = dispatcher.run_once()
    dispatcher.close()

    assert report.sent == 20
    assert len(postmark.requests) == 1  # it was asked, and said no
    assert len(postmark.messages) == 20
    # Then each row alone through the next provider of its chain, every one once.
    with engine.connect() as conn:
        recipients = conn.execute(text("SELECT recipient FROM notifications")).scalars().all()
    assert sorted(m["to"] for m in sendgrid.messages) == sorted(recipients)
    assert len(sendgrid.requests) == 20
    assert set(_rows(engine)) == {("sent", 1, "sendgrid", "sendgrid", "sent", True)}


def test_requests_not_rows_take_the_slots_on_the_loop(
    engine: Engine, make_settings: MakeSettings, make_rows: MakeRows, servers: tuple[EspServer, ...]
) -> None:
    """With one slot, a batch of 50 rows still goes out at once: the slot is the request's."""
    postmark, _ = servers
    make_rows(
        50,
        channel="email",
        recipient=lambda i: f"u{i}@example.com",
        subject="Hi",
        body="Use SPRING.",
    )
    dispatcher = _dispatcher(
        engine, make_settings, servers, failover="email=postmark", async_send_concurrency=1
    )
    report = dispatcher.run_once()
    dispatcher.close()
    assert report.sent == 50
    assert len(postmark.requests) == 1
