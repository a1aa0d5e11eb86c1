"""``notifier.sdk`` against a running ``notifier api`` (uvicorn on loopback, real PostgreSQL and
Redis): what it writes, reads and cancels, and its retries through real faults."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, text

from notifier import sdk
from notifier.api import keys
from notifier.api.app import create_app
from notifier.db import api as api_db
from tests.console_server import free_port, serving
from tests.db_faults import slow_inserts
from tests.factories import MakeSettings


@pytest.fixture
def key(engine: Engine) -> str:
    made = keys.make("billing")
    with engine.begin() as conn:
        api_db.create_key(conn, made.row)
    return made.key


@pytest.fixture
def app(engine: Engine, make_settings: MakeSettings, redis_url: str) -> Iterator[Any]:
    counter = redis.Redis.from_url(redis_url, socket_timeout=2)
    yield create_app(make_settings(), engine, counter)
    counter.close()


@pytest.fixture
def url(app: Any) -> Iterator[str]:
    with serving(app, free_port()) as served:
        yield served


def statuses(engine: Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [
            tuple(r) for r in conn.execute(text("SELECT dedupe_key, status FROM notifications"))
        ]


def test_notify_get_cancel(url: str, key: str, engine: Engine) -> None:
    with sdk.Client(url, key) as api:
        made = api.notify("email", to="ann@example.com", subject="Hi", body="Welcome",
                          idempotency_key="welcome:1", delay=timedelta(hours=1))  # fmt: skip
        assert made == sdk.Created(made.id, "welcome:1", replayed=False)
        again = api.notify("email", to="ann@example.com", subject="Hi", body="Welcome",
                           idempotency_key="welcome:1", delay=timedelta(hours=1))  # fmt: skip
        assert again.replayed
        assert api.get(made.id)["status"] == "pending"
        assert api.get(idempotency_key="welcome:1")["id"] == made.id
        assert api.cancel(idempotency_key="welcome:1") is True
        assert api.cancel(made.id) is False  # cancelled already
        with pytest.raises(sdk.Refused) as refused:
            api.notify("email", to="not an address", body="x")
        assert (refused.value.status, refused.value.code) == (422, "invalid_notification")
        with pytest.raises(sdk.Refused, match="404 not_found"):
            api.get(made.id + 1000)
    assert statuses(engine) == [("billing:welcome:1", "cancelled")]


def test_notify_many_keys_every_item(url: str, key: str, engine: Engine) -> None:
    items = [
        sdk.notification("email", to=f"u{i}@example.com", subject="Hi", body="x") for i in range(3)
    ] + [{"channel": "email", "to": "bad", "body": "x"}]
    with sdk.Client(url, key) as api:
        results = api.notify_many(items)
    assert [r.status for r in results] == ["created", "created", "created", "refused"]
    assert results[3].error is not None
    assert results[3].error.code == "invalid_notification"
    assert all(r.idempotency_key for r in results[:3])  # so a retried batch writes nothing twice
    assert len(statuses(engine)) == 3


def many(count: int, bad: int) -> list[dict[str, Any]]:
    """``count`` items, the one at ``bad`` refused by the API."""
    return [
        {"channel": "email", "to": "bad" if i == bad else f"u{i}@example.com", "body": "x"}
        for i in range(count)
    ]


@pytest.mark.parametrize("client", ["sync", "async"])
def test_notify_many_splits_what_one_request_cannot_carry(
    client: str, url: str, key: str, engine: Engine
) -> None:
    """25 items, 10 a request, 2 requests at once: a result for each, in the caller's order."""
    items = many(25, bad=17)
    if client == "sync":
        with sdk.Client(url, key) as api:
            results = api.notify_many(items, batch=10, in_flight=2)
            assert api.notify_many([]) == []
    else:

        async def run() -> list[sdk.ItemResult]:
            async with sdk.AsyncClient(url, key) as api:
                return await api.notify_many(items, batch=10, in_flight=2)

        results = asyncio.run(run())
    assert [r.index for r in results] == list(range(25))
    assert [i for i, r in enumerate(results) if r.status != "created"] == [17]
    with engine.connect() as conn:
        written = dict(conn.execute(text("SELECT id, recipient FROM notifications")).all())
    assert {written[r.id] for r in results if r.id is not None} == {
        f"u{i}@example.com" for i in range(25) if i != 17
    }
    with sdk.Client(url, key) as api, pytest.raises(ValueError, match="at least 1"):
        api.notify_many(items, batch=0)


def test_the_async_client_does_the_same(url: str, key: str, engine: Engine) -> None:
    async def run() -> tuple[sdk.Created, dict[str, Any], bool]:
        async with sdk.AsyncClient(url, key) as api:
            made = await api.notify("email", to="ann@example.com", body="x",
                                    send_at=datetime.now(UTC) + timedelta(hours=1))  # fmt: skip
            return made, await api.get(made.id), await api.cancel(made.id)

    made, read, cancelled = asyncio.run(run())
    assert read["id"] == made.id
    assert cancelled
    assert [s for _, s in statuses(engine)] == ["cancelled"]


def test_a_lost_answer_is_tried_again_and_answered_by_the_first_row(
    app: Any, key: str, engine: Engine
) -> None:
    # A fault for real: the database takes 2 s to write the row, the client gives up after 1 s
    # and tries again while the first request still holds its key.
    slow_inserts(engine, 2)
    with serving(app, free_port()) as url, sdk.Client(url, key, timeout=1, backoff=0.2) as api:
        started = time.monotonic()
        made = api.notify("email", to="ann@example.com", body="x", idempotency_key="once")
        took = time.monotonic() - started
    assert made.replayed  # the first try's answer was lost: this is the row it wrote
    assert took >= 2  # it waited for the first write, rather than writing a second row
    assert statuses(engine) == [("billing:once", "pending")]


def test_an_api_that_is_not_up_yet_is_waited_for(app: Any, key: str, engine: Engine) -> None:
    port = free_port()
    with socket.socket() as probe:  # the fault: nothing listens there when the call starts
        assert probe.connect_ex(("127.0.0.1", port)) != 0
    results: list[sdk.Created] = []
    api = sdk.Client(f"http://127.0.0.1:{port}", key, retries=8, backoff=0.2)
    call = threading.Thread(
        target=lambda: results.append(api.notify("email", to="ann@example.com", body="x"))
    )
    call.start()
    time.sleep(0.3)
    with serving(app, port):
        call.join(60)
    api.close()
    assert len(results) == 1
    assert not results[0].replayed
    assert len(statuses(engine)) == 1


def test_a_client_gives_up_with_unavailable(key: str) -> None:
    port = free_port()
    api = sdk.Client(f"http://127.0.0.1:{port}", key, retries=1, backoff=0.01)
    with api, pytest.raises(sdk.Unavailable) as gone:
        api.get(1)
    assert gone.value.code == "unreachable"
    with pytest.raises(ValueError, match="nk_"):
        sdk.Client("http://127.0.0.1:1", "not-a-key")
    with pytest.raises(ValueError, match="one of them"):
        sdk.Client("http://127.0.0.1:1", key).get()
