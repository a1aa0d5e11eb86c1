"""Provider failover with two real SMTP relays on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from notifier.delivery.dispatcher import Dispatcher
from notifier.providers import chains, registry_of
from notifier.providers.email import EmailProvider
from notifier.providers.null import NullProvider
from notifier.settings import Settings, get_settings
from notifier.specs import parse_failover
from tests.factories import MakeRow, MakeSettings, SetEnv
from tests.smtp_sink import SmtpSink

Relays = tuple[EmailProvider, EmailProvider, SmtpSink, SmtpSink]


@pytest.fixture
def relays(set_env: SetEnv) -> Iterator[tuple[EmailProvider, EmailProvider, SmtpSink, SmtpSink]]:
    """Two relays, each an EmailProvider pointed at its own SMTP server."""
    first, second = SmtpSink().start(), SmtpSink().start()
    providers = []
    for sink in (first, second):
        set_env(smtp_host=sink.host, smtp_port=sink.port)
        providers.append(EmailProvider(get_settings()))
    providers[1].name = "email_backup"  # type: ignore[attr-defined]
    yield providers[0], providers[1], first, second
    first.stop()
    second.stop()


def _rows(engine: Engine, sql: str) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql)).all()]


def test_a_transient_failure_moves_the_row_to_the_next_provider(
    engine: Engine,
    make_settings: MakeSettings,
    make_row: MakeRow,
    relays: Relays,
) -> None:
    primary, backup, first, second = relays
    first.rcpt_replies["ann@example.com"] = "451 4.3.0 relay busy"
    first.rcpt_replies["bob@example.com"] = "550 5.1.1 no such user"
    for recipient in ("ann@example.com", "bob@example.com", "cy@example.com"):
        make_row(channel="email", recipient=recipient, subject="hi")
    dispatcher = Dispatcher(
        engine,
        registry_of([primary, backup]),
        make_settings(failover="email=email,email_backup"),
    )
    dispatcher.run_once()
    dispatcher.close()

    assert first.rcpt_addresses().count("ann@example.com") == 1  # the primary really refused
    assert [m.rcpt_tos for m in second.messages] == [["ann@example.com"]]
    assert {m.rcpt_tos[0] for m in first.messages} == {"cy@example.com"}
    assert _rows(
        engine, "SELECT recipient, status, attempts, provider FROM notifications ORDER BY id"
    ) == [
        ("ann@example.com", "sent", 1, "email_backup"),
        ("bob@example.com", "dead", 1, None),  # permanent: no failover for a bad mailbox
        ("cy@example.com", "sent", 1, "email"),
    ]
    assert _rows(
        engine,
        "SELECT a.provider, a.outcome FROM notification_attempts a JOIN notifications n"
        " ON n.id = a.notification_id WHERE n.recipient = 'ann@example.com'",
    ) == [("email_backup", "sent")]


def test_when_every_provider_fails_the_attempt_counts_once_with_each_error(
    engine: Engine,
    make_settings: MakeSettings,
    make_row: MakeRow,
    relays: Relays,
) -> None:
    primary, backup, first, second = relays
    first.rcpt_replies["ann@example.com"] = "451 4.3.0 relay busy"
    second.rcpt_replies["ann@example.com"] = "421 4.7.0 try again later"
    make_row(channel="email", recipient="ann@example.com", subject="hi")
    dispatcher = Dispatcher(
        engine,
        registry_of([primary, backup]),
        make_settings(failover="email=email,email_backup"),
    )
    dispatcher.run_once()
    dispatcher.close()
    ((status, attempts, error),) = _rows(
        engine, "SELECT status, attempts, last_error FROM notifications"
    )
    assert (status, attempts) == ("pending", 1)
    assert "email: SMTP 451 4.3.0 relay busy" in str(error)
    assert "email_backup: SMTP 421" in str(error)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("email=email,smtp2", "not installed: smtp2"),
        ("email=email,null", "null do not serve 'email'"),
    ],
)
def test_a_wrong_failover_setting_is_refused_at_start(spec: str, message: str) -> None:
    registry = registry_of([NullProvider(Settings())])
    registry.register(EmailProvider(get_settings()))
    with pytest.raises(ValueError, match=message):
        chains(registry, parse_failover(spec))
