"""A message sent through ``sendgrid``, ``mailgun`` or ``postmark`` names its row exactly where
that provider's events hand it back: the metadata the loopback server received, fed to
``notifier events`` (a real process) as the provider's delivery event, finds the row.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from sqlalchemy import Engine, text

from notifier import eventloop
from notifier.providers.base import Sent
from tests.esp_servers import running
from tests.events_endpoint import (
    Endpoint,
    mailgun_signature,
    postmark_auth,
    signed_sendgrid,
)
from tests.factories import MakeRow
from tests.integration.test_esp_providers import CLASSES, configured, row


def delivery(engine: Engine, row_id: int) -> str | None:
    with engine.begin() as conn:
        found = conn.execute(
            text("SELECT delivery_status FROM notifications WHERE id = :i"), {"i": row_id}
        ).scalar_one()
    return str(found) if found is not None else None


def event(
    kind: str, message: dict[str, Any], message_id: str | None
) -> tuple[bytes, dict[str, Any]]:
    """The provider's own delivery event for ``message``, carrying back its metadata."""
    if kind == "sendgrid":  # custom_args come back as top-level fields of each event
        doc = [
            {
                "email": message["to"],
                "timestamp": int(time.time()),
                "event": "delivered",
                "sg_event_id": "ev-1",
                "sg_message_id": f"{message_id}.filter0001",
                **message["metadata"],
            }
        ]
        return json.dumps(doc).encode(), {}
    if kind == "mailgun":  # v: variables come back as user-variables
        doc2 = {
            "signature": mailgun_signature("tok-roundtrip"),
            "event-data": {
                "event": "delivered",
                "timestamp": time.time(),
                "recipient": message["to"],
                "user-variables": message["metadata"],
                "message": {"headers": {"message-id": (message_id or "").strip("<>")}},
                "delivery-status": {"code": 250, "message": "OK"},
            },
        }
        return json.dumps(doc2).encode(), {}
    doc3 = {  # Postmark hands its Metadata back as it was sent
        "RecordType": "Delivery",
        "MessageID": message_id,
        "Recipient": message["to"],
        "DeliveredAt": "2026-01-01T00:00:00Z",
        "Details": "250 OK",
        "Metadata": message["metadata"],
    }
    return json.dumps(doc3).encode(), postmark_auth()


@pytest.mark.parametrize("kind", ["sendgrid", "mailgun", "postmark"])
def test_a_sends_metadata_fed_back_as_an_event_finds_its_row(
    kind: str, endpoint: Endpoint, engine: Engine, make_row: MakeRow
) -> None:
    other = make_row(
        subject="hi", status="sent", attempts=1, channel="email", recipient="rt@example.com"
    )
    row_id = make_row(
        subject="hi", status="sent", attempts=1, channel="email", recipient="rt@example.com"
    )
    with running(kind) as server:
        provider = CLASSES[kind](configured(kind, server.url))
        try:
            [outcome] = eventloop.run(provider.send_batch_async([row(row_id, "rt@example.com")]))
        finally:
            provider.shutdown()
    assert isinstance(outcome, Sent)
    [message] = server.messages
    body, headers = event(kind, message, outcome.provider_message_id)
    if kind == "sendgrid":
        headers = signed_sendgrid(endpoint, body)
    assert delivery(engine, row_id) is None
    assert endpoint.post(f"/{kind}", body, **headers).status_code == 200
    assert delivery(engine, row_id) == "delivered"
    assert delivery(engine, other) is None  # the row named, not another to the same address
