"""The SQL of recipient profiles and their preferences (migration 0022).

A notification that names a ``profile`` is read with its person: the claim returns the profile
and the person's preference for the row's category on its channel as one JSON value per row
(``CLAIM_PROFILE``, part of the claim's ``RETURNING``), so addressing by profile costs no round
trip, and a row that names none costs nothing. What is read is held to the claim's limits
(texts cut one character past them, the fields not read past the payload's read limit, at most
``MAX_PUSH_TOKENS`` tokens), so no profile can make a claim fail.

Producers write profiles with ``upsert_statement``'s upsert (``notifier.client`` and
``notifier profile set`` run it); each change of a preference is kept in
``preference_history`` by a trigger.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, time
from typing import Any

from sqlalchemy import Connection, text

from notifier.models import PROFILE_ADDRESSES, Profile
from notifier.specs import QuietWindow

#: The most push tokens of one profile a claim reads (devices beyond it are not sent to).
MAX_PUSH_TOKENS = 20

# Correlated with the claimed row ``n``; evaluated only for rows that name a profile. A profile
# named but absent reads as ``{}`` with ``missing`` set.
CLAIM_PROFILE = f"""
    CASE WHEN n.profile IS NOT NULL THEN coalesce((
        SELECT json_build_object(
                   'email', left(p.email, :text_cap), 'phone', left(p.phone, :text_cap),
                   'push_tokens', (SELECT json_agg(left(t, :text_cap))
                                     FROM unnest(p.push_tokens[1:{MAX_PUSH_TOKENS}]) AS t),
                   'locale', left(p.locale, :name_cap),
                   'time_zone', left(p.time_zone, :name_cap),
                   'fields', CASE WHEN pg_column_size(p.fields) <= :payload_cap
                                  THEN p.fields END,
                   'quiet', CASE WHEN p.quiet_start IS NOT NULL
                                 THEN json_build_array(p.quiet_start, p.quiet_end) END,
                   'enabled', (SELECT pr.enabled FROM preferences pr
                                WHERE pr.profile = p.id AND pr.category = n.category
                                  AND pr.channel = n.channel))::text
          FROM profiles p WHERE p.id = n.profile), '{{"missing": true}}')
    END
"""


def decode(profile_id: str | None, read: str | None) -> Profile | str | None:
    """A claimed row's profile from what ``CLAIM_PROFILE`` read: ``None`` when the row names
    none, the reason it cannot be used when it cannot."""
    if profile_id is None or read is None:
        return None
    found = json.loads(read)
    if found.get("missing"):
        return (
            f"profile {profile_id!r} does not exist: upsert it into profiles before its rows"
            " are due, or address the row to a recipient"
        )
    fields = found.get("fields")
    if fields is None:
        return f"profile {profile_id!r} has fields too large to read: keep them to a few KB"
    if not isinstance(fields, dict):
        return f"profile {profile_id!r} has fields that are not a JSON object"
    return Profile(
        profile_id,
        email=found.get("email"),
        phone=found.get("phone"),
        push_tokens=tuple(found.get("push_tokens") or ()),
        locale=found.get("locale"),
        time_zone=found.get("time_zone"),
        fields=fields,
        enabled=found.get("enabled"),
        quiet=_window(found.get("quiet")),
    )


def _window(read: list[str] | None) -> QuietWindow | None:
    """A profile's quiet hours as the claim read them (``["22:00:00", "07:00:00"]``)."""
    if not read:
        return None
    start, end = (time.fromisoformat(part) for part in read)
    return start, end


PROFILE_COLUMNS = (
    "email", "phone", "push_tokens", "locale", "time_zone", "fields", "quiet_start", "quiet_end",
)  # fmt: skip


def addressing(
    channel: str, recipient: str, profile_id: str | None, read: str | None
) -> tuple[str, Profile | None, str | None]:
    """A claimed row's recipient, profile and defect: a row that names a profile and leaves
    ``recipient`` empty goes to the profile's address on its channel; one whose profile is
    missing, unreadable or has no such address gets the reason as its defect."""
    profile = decode(profile_id, read)
    if isinstance(profile, str):
        return recipient, None, profile
    if profile is None or recipient:
        return recipient, profile, None
    if channel == "push":  # to each device, as a row of its own: see ``fan_out``
        if profile.push_tokens:
            return recipient, profile, None
        return (
            recipient,
            profile,
            (f"profile {profile.id!r} has no push token: add its devices to push_tokens"),
        )
    address = profile.address(channel)
    if address is None:
        wanted = PROFILE_ADDRESSES.get(channel)
        fix = f"set its {wanted}" if wanted else f"{channel} rows need their recipient written"
        return recipient, profile, f"profile {profile.id!r} has no {channel} address: {fix}"
    return address, profile, None


FAN_OUT = text(
    "SELECT id, notifier_fan_out(id, :token, CAST(:worker AS text), :devices)"
    " FROM unnest(CAST(:ids AS bigint[])) AS id"
)


def fan_out(conn: Connection, token: Any, ids: list[int], worker: str) -> dict[int, str | None]:
    """Write out the push rows ``ids`` (to a person, held by the claim ``token``) as one row per
    device of their person (migration 0025's ``notifier_fan_out``); each row's new status:
    ``sent``, ``dead`` (no token left, or its devices' rows could not be written: the reason
    is its ``last_error``), or ``None`` for one the claim no longer holds."""
    found = conn.execute(
        FAN_OUT, {"token": token, "worker": worker, "devices": MAX_PUSH_TOKENS, "ids": ids}
    )
    return {int(i): status for i, status in found}


def upsert_statement(given: Iterable[str]) -> str:
    """The upsert of a profile that sets the columns ``given`` names (of ``PROFILE_COLUMNS``;
    others are refused), keeping the others; ``fields`` is bound as JSON text."""
    unknown = set(given) - set(PROFILE_COLUMNS)
    if unknown:
        raise ValueError(f"profiles have no column {sorted(unknown)[0]!r}")
    names = ["id", *(name for name in PROFILE_COLUMNS if name in set(given))]
    values = ["CAST(:fields AS jsonb)" if name == "fields" else f":{name}" for name in names]
    sets = "".join(f"{name} = excluded.{name}, " for name in names[1:])
    return (
        f"INSERT INTO profiles ({', '.join(names)}) VALUES ({', '.join(values)})"
        f" ON CONFLICT (id) DO UPDATE SET {sets}updated_at = now() RETURNING id"
    )


@dataclass(frozen=True, slots=True)
class StoredProfile:
    """A profile as stored, for people to read (``notifier profile show``, the console)."""

    id: str
    email: str | None
    phone: str | None
    push_tokens: list[str]
    locale: str | None
    time_zone: str | None
    fields: dict[str, Any]
    quiet_start: time | None
    quiet_end: time | None
    created_at: datetime
    updated_at: datetime


def get(conn: Connection, profile_id: str) -> StoredProfile | None:
    """The profile ``profile_id``, or ``None``."""
    row = conn.execute(
        text(
            f"SELECT id, {', '.join(PROFILE_COLUMNS)}, created_at, updated_at"
            " FROM profiles WHERE id = :id"
        ),
        {"id": profile_id},
    ).first()
    return None if row is None else StoredProfile(*row)


@dataclass(frozen=True, slots=True)
class Preference:
    """What a person chose for a category on a channel, who chose it and when."""

    category: str
    channel: str
    enabled: bool
    source: str
    at: datetime


def set_preferences(
    conn: Connection, profile_id: str, chosen: Mapping[tuple[str, str], bool], source: str
) -> None:
    """Record choices, each (category, channel) on or off, in one statement (the trigger keeps
    each in the history when it changes anything)."""
    if not chosen:
        return
    conn.execute(
        text(
            "INSERT INTO preferences (profile, category, channel, enabled, source)"
            " SELECT :profile, category, channel, enabled, :source"
            "   FROM unnest(CAST(:categories AS text[]), CAST(:channels AS text[]),"
            "               CAST(:enabled AS boolean[])) AS c(category, channel, enabled)"
            " ON CONFLICT (profile, category, channel) DO UPDATE"
            " SET enabled = excluded.enabled, source = excluded.source, updated_at = now()"
        ),
        {
            "profile": profile_id,
            "categories": [category for category, _ in chosen],
            "channels": [channel for _, channel in chosen],
            "enabled": list(chosen.values()),
            "source": source,
        },
    )


def preferences(conn: Connection, profile_id: str) -> list[Preference]:
    """The person's choices, by category and channel."""
    rows = conn.execute(
        text(
            "SELECT category, channel, enabled, source, updated_at FROM preferences"
            " WHERE profile = :id ORDER BY category, channel"
        ),
        {"id": profile_id},
    )
    return [Preference(*row) for row in rows]


def history(conn: Connection, profile_id: str, limit: int = 100) -> list[Preference]:
    """The person's last ``limit`` changes of preference, the latest first."""
    rows = conn.execute(
        text(
            "SELECT category, channel, enabled, source, at FROM preference_history"
            " WHERE profile = :id ORDER BY id DESC LIMIT :limit"
        ),
        {"id": profile_id, "limit": limit},
    )
    return [Preference(*row) for row in rows]


def recent(conn: Connection, profile_id: str, limit: int = 50) -> list[dict[str, Any]]:
    """The person's latest notifications, newest first (``notifications_profile``)."""
    rows = conn.execute(
        text(
            "SELECT id, channel, recipient, status, category, created_at, updated_at, last_error"
            " FROM notifications WHERE profile = :id ORDER BY id DESC LIMIT :limit"
        ),
        {"id": profile_id, "limit": limit},
    )
    return [dict(r) for r in rows.mappings()]


__all__ = [
    "CLAIM_PROFILE",
    "MAX_PUSH_TOKENS",
    "PROFILE_COLUMNS",
    "Preference",
    "StoredProfile",
    "addressing",
    "decode",
    "fan_out",
    "get",
    "history",
    "preferences",
    "recent",
    "set_preferences",
    "upsert_statement",
]
