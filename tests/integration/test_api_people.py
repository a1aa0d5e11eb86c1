"""The API's profiles, preferences and campaign status, through a plain HTTP client."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
from sqlalchemy import Engine, text

from notifier.api import keys
from notifier.api.app import create_app
from notifier.campaigns import Campaigns
from notifier.db import api as api_db
from tests.console_server import free_port, serving
from tests.factories import MakeSettings


@pytest.fixture
def api(engine: Engine, make_settings: MakeSettings, redis_url: str) -> Iterator[str]:
    counter = redis.Redis.from_url(redis_url, socket_timeout=2)
    with serving(create_app(make_settings(), engine, counter), free_port()) as url:
        yield url
    counter.close()


def key(engine: Engine, **scopes: Any) -> dict[str, str]:
    made = keys.make("crm", **scopes)
    with engine.begin() as conn:
        api_db.create_key(conn, made.row)
    return {"Authorization": f"Bearer {made.key}"}


def test_a_profile_is_upserted_read_and_given_preferences(api: str, engine: Engine) -> None:
    auth = key(engine)
    put = httpx.put(
        f"{api}/v1/profiles/user-42",
        json={
            "email": "ann@example.com",
            "time_zone": "Europe/Vienna",
            "locale": "de-AT",
            "fields": {"first_name": "Ann"},
            "quiet_hours": "22:00-07:00",
        },
        headers=auth,
    )
    assert put.status_code == 200, put.text
    assert put.json()["email"] == "ann@example.com"
    assert put.json()["quiet_start"] == "22:00:00"
    again = httpx.put(f"{api}/v1/profiles/user-42", json={"phone": "+14155550100"}, headers=auth)
    assert again.json()["email"] == "ann@example.com"  # what is not given is kept
    assert again.json()["phone"] == "+14155550100"
    chosen = httpx.put(
        f"{api}/v1/profiles/user-42/preferences",
        json={"preferences": [{"category": "marketing", "channel": "email", "enabled": False}]},
        headers=auth,
    )
    assert chosen.status_code == 200, chosen.text
    [preference] = chosen.json()["preferences"]
    assert (preference["category"], preference["enabled"], preference["source"]) == (
        "marketing",
        False,
        "producer",
    )
    with engine.connect() as conn:
        history = conn.execute(text("SELECT source, enabled FROM preference_history")).all()
    assert [tuple(h) for h in history] == [("producer", False)]


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        ("/v1/profiles/user-42", {"emial": "x"}, 422, "unknown_field"),
        ("/v1/profiles/user-42", {"time_zone": "Mars/Olympus"}, 422, "invalid_profile"),
        ("/v1/profiles/user-42", {"email": "a\u0000b"}, 422, "invalid_profile"),
        ("/v1/profiles/user-42", {"fields": {"x": "\ud800"}}, 422, "invalid_profile"),
        ("/v1/profiles/user-42", {"push_tokens": "one"}, 422, "invalid_field"),
        ("/v1/profiles/not%20an%20id", {"email": "a@b.c"}, 404, "not_found"),
        (
            "/v1/profiles/nobody/preferences",
            {"preferences": [{"category": "news", "channel": "email", "enabled": True}]},
            404,
            "not_found",
        ),
        (
            "/v1/profiles/user-42/preferences",
            {"preferences": [{"category": "Bad Category", "channel": "email", "enabled": True}]},
            422,
            "invalid_field",
        ),
        ("/v1/profiles/user-42/preferences", {"preferences": []}, 422, "invalid_body"),
    ],
)
def test_bad_profiles_are_refused_and_change_nothing(
    api: str, engine: Engine, path: str, body: Any, status: int, code: str
) -> None:
    answer = httpx.put(
        api + path,
        content=json.dumps(body).encode(),  # ASCII, escapes and all: a lone surrogate too
        headers={**key(engine), "Content-Type": "application/json"},
    )
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["code"] == code
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM profiles")).scalar_one() == 0


def test_a_read_only_key_reads_profiles_and_writes_none(api: str, engine: Engine) -> None:
    writer, reader = key(engine), key(engine, read_only=True)
    assert httpx.put(f"{api}/v1/profiles/u1", json={"email": "a@b.c"}, headers=writer).is_success
    assert httpx.get(f"{api}/v1/profiles/u1", headers=reader).json()["email"] == "a@b.c"
    refused = httpx.put(f"{api}/v1/profiles/u1", json={"email": "x@y.z"}, headers=reader)
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, "read_only_key")
    assert httpx.get(f"{api}/v1/profiles/u2", headers=reader).status_code == 404


def test_a_campaign_s_status(api: str, engine: Engine) -> None:
    campaigns = Campaigns(engine)
    campaigns.create("spring", "null", body="Code {code}")
    campaigns.import_audience("spring", io.StringIO("email\na@x.org\nb@x.org\n"), "email")
    campaigns.generate_codes("spring", 2)
    campaigns.launch("spring")
    found = httpx.get(f"{api}/v1/campaigns/spring", headers=key(engine))
    assert found.status_code == 200, found.text
    assert found.json()["status"] == "running"
    assert found.json()["notifications"] == 2
    assert httpx.get(f"{api}/v1/campaigns/autumn", headers=key(engine)).status_code == 404
