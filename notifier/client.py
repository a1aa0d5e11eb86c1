"""The producers' helpers: enqueue and cancel inside the caller's own transaction.

Works with a SQLAlchemy ``Connection`` or a psycopg 3 connection; nothing is committed here, so
the notification is written if and only if the caller's transaction commits::

    with engine.begin() as conn:
        conn.execute(insert_user)
        notifier.enqueue(conn, channel="email", to="ann@example.com",
                         subject="Welcome", body="...", key=f"welcome:{user_id}")
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from notifier.db import producers
from notifier.delivery.intake import intake_for, unstorable_json, would_be
from notifier.settings import get_settings
from notifier.specs import parse_category


@dataclass(frozen=True, slots=True)
class Enqueued:
    id: int
    #: False when a row with the same dedupe key already existed (nothing was written)
    created: bool


def enqueue(
    conn: producers.ProducerConnection,
    *,
    channel: str,
    to: str,
    subject: str | None = None,
    body: str | None = None,
    payload: Mapping[str, Any] | None = None,
    key: str | None = None,
    send_at: datetime | None = None,
    delay: timedelta | None = None,
    max_attempts: int = 5,
    priority: int = 0,
    expires_at: datetime | None = None,
    guard: str | None = None,
    template: str | None = None,
    locale: str | None = None,
    category: str | None = None,
) -> Enqueued:
    """Write one notification; with ``key``, a second call with the same key writes nothing.

    ``send_at`` (timezone-aware) or ``delay`` makes it a delayed send; a row not sent by
    ``expires_at`` is cancelled instead of sent late. ``guard`` names a send-time check (e.g.
    ``"http"``) that must agree right before the send. ``template`` (with ``locale``) names a
    stored template to render from ``payload`` instead of ``subject``/``body``. ``category``
    says what the message is (``security``, ``billing``, ``marketing``): an opt-out of a
    category stops only its rows; ``None`` (the default) is transactional.

    A row a worker would give up unsent is not written: ``ValueError`` says why, in the words
    of the reason the worker would record (``notifier.delivery.intake``), and nothing reaches
    the caller's transaction but a read of the row's template.
    """
    if send_at is not None and delay is not None:
        raise ValueError("give send_at or delay, not both")
    if send_at is not None and send_at.tzinfo is None:
        raise ValueError("send_at must be timezone-aware")
    if delay is not None:
        send_at = datetime.now(UTC) + delay
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")
    if expires_at is not None and expires_at.tzinfo is None:
        raise ValueError("expires_at must be timezone-aware")
    if expires_at is not None and expires_at <= (send_at or datetime.now(UTC)):
        raise ValueError("expires_at is not after the send time: the row would expire unsent")
    if payload is not None and not isinstance(payload, Mapping):
        raise ValueError(f"payload must be a mapping (a JSON object), not {type(payload).__name__}")
    if category is not None:
        parse_category(category)
    try:
        document = json.dumps(dict(payload or {}), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"invalid notification: payload is not JSON-serializable: {exc}") from None
    refused = unstorable_json("payload", document)
    row = would_be(
        channel=channel,
        recipient=to,
        subject=subject,
        body=body,
        payload=json.loads(document) if refused is None else {},
        dedupe_key=key,
        guard=guard,
        template=template,
        locale=locale,
        category=category,
        max_attempts=max_attempts,
        priority=priority,
    )
    refused = refused or intake_for(get_settings()).refusal(
        row, lambda name, channel: producers.templates_of(conn, name, channel)
    )
    if refused is not None:
        raise ValueError(refused)
    row_id, created = producers.enqueue_row(
        conn,
        {
            "channel": channel,
            "recipient": to,
            "subject": subject,
            "body": body,
            "payload": document,
            "dedupe_key": key,
            "max_attempts": max_attempts,
            "priority": priority,
            "send_at": send_at,
            "expires_at": expires_at,
            "guard": guard,
            "template": template,
            "locale": locale,
            "category": category,
        },
    )
    return Enqueued(row_id, created)


def cancel(
    conn: producers.ProducerConnection, key: str, reason: str = "cancelled by producer"
) -> bool:
    """Cancel the unsent notification with this dedupe key; False if there was none.

    A row already claimed by a worker is cancelled too: the worker looks again right before
    sending. Only a send already under way at that moment still goes out.
    """
    return producers.cancel_by_key(conn, key, reason) is not None
