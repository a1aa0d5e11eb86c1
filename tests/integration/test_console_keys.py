"""API keys in the console: listed by prefix for everyone, made (shown once) and revoked by an
admin only; a key made there works against the API at once, and not once revoked. A real
console process, a real API server, real PostgreSQL."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, text

from notifier.api.app import create_app
from tests.console_server import Console, console_env, free_port, serving
from tests.factories import MakeSettings


@pytest.fixture
def console(database_url: str, tmp_path: Path) -> Iterator[Console]:
    server = Console(console_env(database_url), tmp_path / "console.log").start()
    yield server
    server.stop()


def test_an_admin_makes_a_key_that_works_once_and_revokes_it(
    console: Console, engine: Engine, make_settings: MakeSettings
) -> None:
    alice, bob = console.client(), console.client()
    csrf, bob_csrf = alice.login("alice"), bob.login("bob")
    refused = bob.request("POST", "/keys", {"csrf": bob_csrf, "name": "shop"})
    assert refused.status_code == 403  # a viewer reads keys, never makes one

    made = alice.request("POST", "/keys", {"csrf": csrf, "name": "shop", "channels": "email"})
    assert made.status_code == 200
    assert "no-store" in made.headers["cache-control"]  # the key is on this page, only here
    [key] = re.findall(r'value="(nk_[a-z2-7]{10}\.[A-Za-z0-9_-]{43})"', made.text)
    prefix = key.split(".")[0]
    listed = bob.request("GET", "/keys").text
    assert prefix in listed
    assert key not in listed  # shown once: never listed again
    assert "Revoke" not in listed  # not for a viewer
    with engine.connect() as conn:
        (stored,) = conn.execute(text("SELECT secret_hash FROM api_keys")).one()
    assert key.encode() not in bytes(stored)

    mail = {"channel": "email", "to": "ann@example.com", "subject": "Hi", "body": "x"}
    auth = {"Authorization": f"Bearer {key}"}
    with serving(create_app(make_settings(), engine, None), free_port()) as api:
        assert httpx.post(f"{api}/v1/notifications", json=mail, headers=auth).status_code == 201
        sms = {"channel": "sms", "to": "+14155550100", "body": "x"}
        assert httpx.post(f"{api}/v1/notifications", json=sms, headers=auth).status_code == 403
        revoked = alice.request("POST", f"/keys/{prefix}/revoke", {"csrf": csrf})
        assert (revoked.status_code, revoked.headers["location"]) == (303, "/keys?revoked=1")
        assert httpx.post(f"{api}/v1/notifications", json=mail, headers=auth).status_code == 401
    assert alice.request("POST", f"/keys/{prefix}/revoke", {"csrf": csrf}).status_code == 404
    bad = alice.request("POST", "/keys", {"csrf": csrf, "name": "Not A Name"})
    assert bad.status_code == 400
