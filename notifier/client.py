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
from notifier.models import Profile
from notifier.settings import get_settings
from notifier.specs import (
    normalize_locale,
    parse_category,
    parse_profile_id,
    parse_quiet_window,
    parse_time_zone,
)

#: A payload as its row stores it: made once (``json.dumps`` would make one a row).
_PAYLOAD = json.JSONEncoder(ensure_ascii=False, allow_nan=False)


@dataclass(frozen=True, slots=True)
class Enqueued:
    id: int
    #: False when a row with the same dedupe key already existed (nothing was written)
    created: bool


def enqueue(
    conn: producers.ProducerConnection,
    *,
    channel: str,
    to: str | None = None,
    profile: str | None = None,
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
    values = checked_row(
        conn,
        channel=channel,
        to=to,
        profile=profile,
        subject=subject,
        body=body,
        payload=payload,
        key=key,
        send_at=send_at,
        delay=delay,
        max_attempts=max_attempts,
        priority=priority,
        expires_at=expires_at,
        guard=guard,
        template=template,
        locale=locale,
        category=category,
    )
    row_id, created = producers.enqueue_row(conn, values)
    return Enqueued(row_id, created)


def checked_row(
    conn: producers.ProducerConnection,
    *,
    channel: str,
    to: str | None = None,
    profile: str | None = None,
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
) -> dict[str, Any]:
    """The row ``enqueue`` writes, as the values of ``producers.enqueue_row``, after the checks
    a worker would make; ``ValueError`` with the reason if it would give the row up."""
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
    address, person = _addressee(conn, channel, to, profile)
    try:
        document = _PAYLOAD.encode(dict(payload)) if payload else "{}"
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"invalid notification: payload is not JSON-serializable: {exc}") from None
    refused = unstorable_json("payload", document)
    row = would_be(
        channel=channel,
        recipient=address,
        subject=subject,
        body=body,
        payload=json.loads(document) if refused is None and document != "{}" else {},
        dedupe_key=key,
        guard=guard,
        template=template,
        locale=locale or (person.locale if person is not None else None),
        category=category,
        max_attempts=max_attempts,
        priority=priority,
        profile=person,
    )
    refused = refused or intake_for(get_settings()).refusal(
        row, lambda name, channel: producers.templates_of(conn, name, channel)
    )

    if refused is not None:
        raise ValueError(refused)
    return {
        "channel": channel,
        "recipient": "" if to is None else to,  # "": the profile's, read when sent
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
        "profile": profile,
    }


def _addressee(
    conn: producers.ProducerConnection, channel: str, to: str | None, profile: str | None
) -> tuple[str, Profile | None]:
    """The address a would-be row is checked with (``to``, or the profile's on ``channel``),
    and the profile it names as the caller's transaction sees it."""
    if profile is None:
        if to is None:
            raise ValueError("give the recipient: to=, or profile= to address a person's profile")
        return to, None
    parse_profile_id(profile)
    person = producers.profile(conn, profile)
    if to is not None:
        return to, person
    if person is None:
        raise ValueError(f"no profile {profile!r}: upsert_profile() it first, in this transaction")
    if channel == "push":  # each device gets a row of its own when it is due
        if not person.push_tokens:
            raise ValueError(
                f"profile {profile!r} has no push token: set push_tokens with upsert_profile()"
            )
        return "", person
    address = person.address(channel)
    if address is None:
        raise ValueError(
            f"profile {profile!r} has no {channel} address: set it with upsert_profile()"
        )
    return address, person


def upsert_profile(
    conn: producers.ProducerConnection,
    profile_id: str,
    *,
    email: str | None = None,
    phone: str | None = None,
    push_tokens: list[str] | None = None,
    locale: str | None = None,
    time_zone: str | None = None,
    fields: Mapping[str, Any] | None = None,
    quiet_hours: str | None = None,
) -> None:
    """Create the person ``profile_id`` (your own id for them) or change what is given of
    them, in the caller's transaction; what is not given keeps its value. Rows already waiting
    for this person are sent to the addresses it holds when they are sent. ``quiet_hours``
    (``22:00-07:00`` in ``time_zone``; ``""`` for none) replaces the deployment's default
    window for this person (``NOTIFIER_QUIET_HOURS``)."""
    parse_profile_id(profile_id)
    values: dict[str, Any] = {
        name: value
        for name, value in (
            ("email", email), ("phone", phone), ("push_tokens", push_tokens),
            ("locale", locale), ("time_zone", time_zone),
        )
        if value is not None
    }  # fmt: skip
    if locale is not None:
        values["locale"] = normalize_locale(locale)
    if time_zone is not None:
        values["time_zone"] = parse_time_zone(time_zone)
    if quiet_hours is not None:  # "": none of their own (the deployment's default holds)
        window = parse_quiet_window(quiet_hours) if quiet_hours else (None, None)
        values["quiet_start"], values["quiet_end"] = window
    if fields is not None:
        if not isinstance(fields, Mapping):
            raise ValueError("fields must be a mapping (a JSON object)")
        try:
            values["fields"] = json.dumps(dict(fields), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            raise ValueError(f"fields are not JSON-serializable: {exc}") from None
    producers.upsert_profile(conn, profile_id, values)


__all__ = ["Enqueued", "cancel", "checked_row", "enqueue", "upsert_profile"]


def cancel(
    conn: producers.ProducerConnection, key: str, reason: str = "cancelled by producer"
) -> bool:
    """Cancel the unsent notification with this dedupe key; False if there was none.

    A row already claimed by a worker is cancelled too: the worker looks again right before
    sending. Only a send already under way at that moment still goes out.
    """
    return producers.cancel_by_key(conn, key, reason) is not None
