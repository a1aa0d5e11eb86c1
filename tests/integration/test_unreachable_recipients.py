"""Recipients no request can ever reach go ``dead`` at their first attempt, not into retries.

A webhook to port 0 or to a host name the DNS's rules forbid, and an email whose domain is not
a valid (IDNA) name, were tried, failed like a passing network fault and were retried until
their attempts ran out. Drained here by the real dispatcher with the registered providers,
among good rows that the real SMTP sink receives.
"""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text

from notifier.delivery.dispatcher import Dispatcher
from notifier.providers import load_registry
from notifier.settings import Settings, get_settings
from tests.factories import MakeRow
from tests.smtp_sink import SmtpSink

INVALID = "invalid notification: "
UNREACHABLE = [
    (
        "webhook",
        "https://hooks.example.com:0/orders",
        INVALID + "recipient URL has port 0, which no connection can reach; give the "
        "receiver's port (1-65535), or none for the scheme's default",
    ),
    (
        "webhook",
        "https://hooks..example.com/orders",
        INVALID + "recipient URL host 'hooks..example.com' can never be looked up: it has an "
        "empty label (two dots in a row, or a dot at the start)",
    ),
    (
        "webhook",
        "https://xn--.example.com/orders",
        INVALID + "recipient URL host 'xn--.example.com' can never be looked up: it has a "
        "label 'xn--' that begins or ends with a hyphen",
    ),
    (
        "webhook",
        "https://" + "h" * 64 + ".example.com/orders",
        INVALID + "recipient URL host '" + "h" * 64 + ".example.com' can never be looked up: "
        "it has a label of 64 characters; at most 63 allowed",
    ),
    (
        "email",
        "user@xn--.com",
        INVALID + "recipient 'user@xn--.com' is not a valid email address: its domain has a "
        "label 'xn--' that begins or ends with a hyphen",
    ),
    (
        "email",
        "user@xn--zz.example.com",
        INVALID + "recipient 'user@xn--zz.example.com' is not a valid email address: its domain "
        "has a label 'xn--zz' that is not a valid internationalised (IDNA) label",
    ),
    (
        "email",
        "user@-shop.example.com",
        INVALID + "recipient 'user@-shop.example.com' is not a valid email address: its domain "
        "has a label '-shop' that begins or ends with a hyphen",
    ),
    (
        "email",
        "user@" + "d" * 64 + ".com",
        INVALID + "recipient 'user@" + "d" * 64 + ".com' is not a valid email address: its "
        "domain has a label of 64 characters; at most 63 allowed",
    ),
]


@pytest.mark.timeout(60)
def test_unreachable_recipients_are_dead_at_once_and_hold_back_no_neighbour(
    engine: Engine, settings: Settings, smtp_sink: SmtpSink, make_row: MakeRow
) -> None:
    ids = {
        make_row(channel=channel, recipient=recipient, max_attempts=5): reason
        for channel, recipient, reason in UNREACHABLE
    }
    good = [f"ada{i}@example.com" for i in range(3)] + ["bo@xn--mlaut-jva.example"]
    for address in good:
        make_row(channel="email", recipient=address)

    dispatcher = Dispatcher(engine, load_registry(get_settings()), settings)
    try:
        dispatcher.run_once()
    finally:
        dispatcher.close()

    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT id, recipient, status, attempts, last_error FROM notifications")
        ).all()
    got = {row_id: (status, attempts, error) for row_id, _, status, attempts, error in rows}
    for row_id, reason in ids.items():
        assert got[row_id] == ("dead", 1, reason)
    assert sorted(r for _, r, status, *_ in rows if status == "sent") == sorted(good)
    assert sorted(r for m in smtp_sink.messages for r in m.rcpt_tos) == sorted(good)
