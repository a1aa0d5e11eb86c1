"""Fault test 7: hostile rows among good ones, drained by the real dispatcher and providers.

1,000 good emails and one row of each hostile kind go through ``Dispatcher.drain`` with the
registered providers, against the real SMTP sink and a listening socket on loopback. Every
hostile row must end ``dead`` after exactly one attempt with a reason its producer can act on,
every good row ``sent``, and nothing a hostile row tried to inject may reach a server: the SMTP
sink sees exactly the 1,000 good recipients and no ``Bcc``, the loopback socket no connection.

The rows refused by ``notifier.delivery.checks.check_common`` (payload too big, recipient too long)
need the dispatcher to call it before the provider's ``validate``.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from importlib.metadata import entry_points
from typing import Any

import pytest
from sqlalchemy import Engine, text

from notifier.delivery.checks import payload_size
from notifier.delivery.dispatcher import Dispatcher
from notifier.providers import load_registry
from notifier.settings import Settings, get_settings
from tests.factories import MakeRow, SetEnv
from tests.smtp_sink import SmtpSink

GOOD = 1000
OVERSIZED = {"html": "<p>" + "x" * 70_000 + "</p>"}
REFUSED_BY_ADDRESS = (
    "; notifier does not call internal networks. Use a public URL, or have the operator allow "
    "that network with NOTIFIER_WEBHOOK_ALLOWED_NETWORKS"
)


PROVIDERS = "notifier.providers"


def hostile_rows(port: int) -> list[tuple[str, dict[str, Any], str]]:
    """(name, the row's columns, its expected ``last_error``; a trailing ``*`` = a prefix)."""

    def email(recipient: str = "eve@example.com", **columns: Any) -> dict[str, Any]:
        return {"channel": "email", "recipient": recipient, **columns}

    def webhook(url: str) -> dict[str, Any]:
        return {"channel": "webhook", "recipient": url}

    invalid = "invalid notification: "
    return [
        (
            "unknown channel",
            {"channel": "pigeon", "recipient": "ada@example.com"},
            "unknown channel 'pigeon'; this deployment serves: "
            + ", ".join(sorted({ep.load().channel for ep in entry_points(group=PROVIDERS)})),
        ),
        (
            "empty recipient",
            email(""),
            invalid + "recipient is empty; give the email address to send to",
        ),
        (
            "malformed recipient",
            email("not-an-address"),
            invalid + "recipient 'not-an-address' is not a plain ASCII email address like "
            "'ada@example.com' (give an internationalised domain in punycode)",
        ),
        (
            "webhook not https",
            webhook("http://hooks.example.com/orders"),
            invalid + "recipient URL uses plain http; use https (http:// is only accepted when "
            "NOTIFIER_WEBHOOK_ALLOW_HTTP=true, for local development)",
        ),
        (
            "recipient with CR/LF",
            email("victim@example.com\r\nBcc: all@example.com"),
            invalid + "recipient contains a line break; give one plain address",
        ),
        (
            "subject with CR/LF",
            email(subject="Hi\r\nBcc: x@example.com"),
            invalid + "subject contains U+000D CARRIAGE RETURN at position 2; headers cannot "
            "carry line or paragraph separators; keep it on one line",
        ),
        (
            "header set by payload",
            email(payload={"headers": {"Bcc": "all@example.com"}}),
            invalid + "payload.headers may not set 'Bcc'; notifier writes it (use recipient, "
            "subject, body and payload.html instead)",
        ),
        (
            "header value with CR/LF",
            email(payload={"headers": {"X-Tag": "a\r\nBcc: all@example.com"}}),
            invalid + "payload.headers['X-Tag'] contains U+000D CARRIAGE RETURN at position 1; "
            "headers cannot carry line or paragraph separators; keep it on one line",
        ),
        (
            "payload over the limit",
            email("oversized@example.com", payload=OVERSIZED),
            invalid + f"payload is {payload_size(OVERSIZED)} bytes as JSON; at most 65536 "
            "allowed (NOTIFIER_MAX_PAYLOAD_BYTES): send a link or an id to the data instead "
            "of the data",
        ),
        (
            "html of the wrong type",
            email(payload={"html": 42}),
            invalid + 'payload.html must be a string of HTML like "<p>Hi</p>", not a number (42)',
        ),
        (
            "payload is an array",
            email("array@example.com", payload=[1, 2]),
            invalid + "payload must be a JSON object, not list",
        ),
        (
            "recipient too long",
            {"channel": "null", "recipient": "r" * 3000},
            invalid + "recipient is longer than 2048 characters",
        ),
        (
            "webhook to cloud metadata",
            webhook("https://169.254.169.254/latest/meta-data/iam/security-credentials/"),
            invalid + "webhook target 169.254.169.254 is a link-local address "
            "(in 169.254.0.0/16)" + REFUSED_BY_ADDRESS,
        ),
        (
            "webhook to loopback",
            webhook(f"https://127.0.0.1:{port}/admin"),
            invalid
            + "webhook target 127.0.0.1 is a loopback address (in 127.0.0.0/8)"
            + REFUSED_BY_ADDRESS,
        ),
        (
            # A name: validate() cannot tell, the connection's own check refuses it.
            "webhook to a name for loopback",
            webhook(f"https://localhost:{port}/admin"),
            "webhook target localhost resolves to *",
        ),
    ]


def _died_as(outcome: tuple[str, int, str | None], reason: str) -> bool:
    status, attempts, last_error = outcome
    if (status, attempts) != ("dead", 1) or last_error is None:
        return False
    if not reason.endswith("*"):
        return last_error == reason
    return (
        last_error.startswith(reason[:-1])
        and "a loopback address" in last_error
        and last_error.endswith(REFUSED_BY_ADDRESS)
    )


@pytest.fixture
def loopback_listener() -> Iterator[socket.socket]:
    """A socket that listens and never accepts: a connection to it would wait in its backlog."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.setblocking(False)
        yield listener


def test_hostile_rows_die_alone_and_inject_nothing(
    engine: Engine,
    database_url: str,
    smtp_sink: SmtpSink,
    loopback_listener: socket.socket,
    set_env: SetEnv,
    raw_row: MakeRow,
) -> None:
    set_env(webhook_allowed_networks=None, webhook_allow_http=None, max_payload_bytes=None)
    hostile = hostile_rows(loopback_listener.getsockname()[1])
    good = [f"user{i}@example.com" for i in range(GOOD)]

    rows: list[dict[str, Any]] = [
        {"channel": "email", "recipient": r, "subject": f"Receipt {i}", "key": None}
        for i, r in enumerate(good)
    ]
    for position, (name, columns, _) in enumerate(hostile):  # spread across the batches
        rows.insert(position * (GOOD // len(hostile)), {**columns, "key": name})
    for row in rows:
        key = row.pop("key")
        payload = json.dumps(row.get("payload", {}))
        raw_row(**{"subject": "Hello", **row, "dedupe_key": key, "payload": payload})

    dispatcher = Dispatcher(
        engine, load_registry(get_settings()), Settings(database_url=database_url, batch_size=100)
    )
    try:
        reports = dispatcher.drain(budget_seconds=300)
    finally:
        dispatcher.close()
    assert sum(r.claimed for r in reports) == GOOD + len(hostile)

    with engine.begin() as conn:
        outcome = {
            key: (status, attempts, last_error)
            for key, status, attempts, last_error in conn.execute(
                text("SELECT dedupe_key, status, attempts, last_error FROM notifications")
            ).all()
            if key is not None
        }
        good_rows = conn.execute(
            text(
                "SELECT status, attempts, count(*) FROM notifications"
                " WHERE dedupe_key IS NULL GROUP BY 1, 2"
            )
        ).all()

    wrong = {
        name: outcome[name] for name, _, reason in hostile if not _died_as(outcome[name], reason)
    }
    assert wrong == {}
    assert [tuple(r) for r in good_rows] == [("sent", 1, GOOD)]

    # Nothing injected reached a server.
    assert sorted(smtp_sink.rcpt_addresses()) == sorted(good)
    assert len(smtp_sink.messages) == GOOD
    for received in smtp_sink.messages:
        assert received.rcpt_tos[0] in good
        assert received.rcpt_tos == [str(received.message["To"])]
        assert received.message["Bcc"] is None
        assert received.message["Subject"].startswith("Receipt ")
    with pytest.raises(BlockingIOError):
        loopback_listener.accept()
