"""The API's profiles, preferences and campaigns: what ``notifier.client`` and the CLI do for
producers on the database, for a key.

Profiles belong to the deployment, not to a producer (as in SQL, where every producer may read
and upsert them): any key reads them, a key that writes writes them. Preferences set here are
recorded with the source ``producer`` (consent a service imports), as ``notifier profile
prefer`` records ``operator``. A campaign's status is read by name.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime, time
from typing import Any

from sqlalchemy import Engine

from notifier import client
from notifier.api import keys
from notifier.api.bodies import ApiError
from notifier.db import campaigns, profiles
from notifier.db.api import KeyRow
from notifier.delivery.intake import unstorable_json
from notifier.specs import parse_category, parse_profile_id

PROFILE_FIELDS = {"email", "phone", "push_tokens", "locale", "time_zone", "fields", "quiet_hours"}
#: The most preferences one request sets.
MAX_PREFERENCES = 200


class People:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def read(self, profile_id: str) -> dict[str, Any]:
        _profile_id(profile_id)
        with self.engine.connect() as conn:
            found = profiles.get(conn, profile_id)
            chosen = profiles.preferences(conn, profile_id) if found is not None else []
        if found is None:
            raise ApiError(404, "not_found", f"no profile {profile_id!r}")
        return {**_json(asdict(found)), "preferences": [_json(asdict(p)) for p in chosen]}

    def upsert(self, key: KeyRow, profile_id: str, doc: Any) -> dict[str, Any]:
        keys.must_write(key)
        _profile_id(profile_id)
        if not isinstance(doc, dict):
            raise ApiError(422, "invalid_body", "a profile is a JSON object")
        unknown = sorted(set(doc) - PROFILE_FIELDS)
        if unknown:
            raise ApiError(
                422,
                "unknown_field",
                f"{unknown[0][:64]!r} is not a field of a profile",
                unknown[0][:64],
            )
        for name in ("email", "phone", "locale", "time_zone", "quiet_hours"):
            if doc.get(name) is not None and not isinstance(doc[name], str):
                raise ApiError(422, "invalid_field", f"{name} must be a string", name)
        tokens = doc.get("push_tokens")
        if tokens is not None and not (
            isinstance(tokens, list) and all(isinstance(t, str) for t in tokens)
        ):
            raise ApiError(
                422, "invalid_field", "push_tokens must be a list of strings", "push_tokens"
            )
        if doc.get("fields") is not None and not isinstance(doc["fields"], dict):
            raise ApiError(422, "invalid_field", "fields must be a JSON object", "fields")
        refused = unstorable_json("profile", json.dumps(doc, ensure_ascii=False))
        if refused is not None:
            raise ApiError(422, "invalid_profile", refused)
        try:
            with self.engine.begin() as conn:
                client.upsert_profile(conn, profile_id, **doc)
        except ValueError as exc:
            raise ApiError(422, "invalid_profile", str(exc)) from None
        return self.read(profile_id)

    def prefer(self, key: KeyRow, profile_id: str, doc: Any) -> dict[str, Any]:
        keys.must_write(key)
        _profile_id(profile_id)
        listed = doc.get("preferences") if isinstance(doc, dict) else None
        if (
            not isinstance(listed, list)
            or not 0 < len(listed) <= MAX_PREFERENCES
            or set(doc) != {"preferences"}
        ):
            raise ApiError(
                422,
                "invalid_body",
                f'send {{"preferences": [{{"category", "channel", "enabled"}}, ...]}}, 1 to'
                f" {MAX_PREFERENCES}",
                "preferences",
            )
        chosen: dict[tuple[str, str], bool] = {}
        for one in listed:
            if not (
                isinstance(one, dict)
                and set(one) == {"category", "channel", "enabled"}
                and isinstance(one["category"], str)
                and isinstance(one["channel"], str)
                and 0 < len(one["channel"]) <= 64
                and isinstance(one["enabled"], bool)
            ):
                raise ApiError(
                    422,
                    "invalid_field",
                    "each preference is {category: string, channel: string, enabled: boolean}",
                    "preferences",
                )
            try:
                parse_category(one["category"])
            except ValueError as exc:
                raise ApiError(422, "invalid_field", str(exc), "category") from None
            chosen[(one["category"], one["channel"])] = one["enabled"]
        with self.engine.begin() as conn:
            if profiles.get(conn, profile_id) is None:
                raise ApiError(404, "not_found", f"no profile {profile_id!r}: PUT it first")
            profiles.set_preferences(conn, profile_id, chosen, "producer")
        return self.read(profile_id)

    def campaign(self, name: str) -> dict[str, Any]:
        if not 0 < len(name) <= 200:
            raise ApiError(404, "not_found", "no such campaign", "name")
        with self.engine.connect() as conn:
            found = campaigns.by_name(conn, name)
            counts = campaigns.counts(conn, found.id) if found is not None else None
        if found is None or counts is None:
            raise ApiError(404, "not_found", f"no campaign {name!r}", "name")
        return {
            "name": found.name,
            "status": found.status,
            "channel": found.channel,
            "category": found.category,
            "audience": found.audience,
            "recipients": counts.recipients,
            "notifications": counts.notifications,
            "by_status": counts.by_status,
        }


def _profile_id(profile_id: str) -> None:
    try:
        parse_profile_id(profile_id)
    except ValueError as exc:
        raise ApiError(404, "not_found", str(exc), "id") from None


def _json(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, datetime | time) else v for k, v in values.items()}
