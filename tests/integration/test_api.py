"""The HTTP API served by uvicorn on loopback, against real PostgreSQL and Redis, through a plain
HTTP client: keys, idempotency, batches, reads and cancels limited to a key's own rows."""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from notifier.api import bodies, keys, openapi
from notifier.api.app import create_app
from notifier.db import api as api_db
from tests.console_server import free_port, serving
from tests.db_faults import slow_inserts
from tests.factories import MakeSettings
from tests.roles import Logins

ROOT = Path(__file__).resolve().parents[2]
MAIL = {"channel": "email", "to": "ann@example.com", "subject": "Hi", "body": "Welcome"}

MakeKey = Callable[..., str]


@pytest.fixture
def api(engine: Engine, make_settings: MakeSettings, redis_url: str) -> Iterator[str]:
    counter = redis.Redis.from_url(redis_url, socket_timeout=2)
    settings = make_settings(api_rate_per_second=1000)
    with serving(create_app(settings, engine, counter), free_port()) as url:
        yield url
    counter.close()


@pytest.fixture
def make_key(engine: Engine) -> MakeKey:
    def make(name: str = "billing", **scopes: Any) -> str:
        made = keys.make(name, **scopes)
        with engine.begin() as conn:
            api_db.create_key(conn, made.row)
        return made.key

    return make


def call(url: str, key: str | None, method: str, path: str, **kwargs: Any) -> httpx.Response:
    headers = dict(kwargs.pop("headers", {}))
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.request(method, url + path, headers=headers, timeout=10, **kwargs)


def rows(engine: Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        found = conn.execute(
            text(
                "SELECT id, producer, dedupe_key, recipient, status FROM notifications ORDER BY id"
            )
        )
        return [tuple(r) for r in found]


def test_a_notification_written_read_and_cancelled(
    api: str, make_key: MakeKey, engine: Engine
) -> None:
    key = make_key()
    made = call(api, key, "POST", "/v1/notifications", json=MAIL)
    assert made.status_code == 201, made.text
    row_id = made.json()["id"]
    assert made.json() == {"id": row_id, "idempotency_key": None, "replayed": False}
    assert rows(engine) == [(row_id, "billing", None, "ann@example.com", "pending")]

    read = call(api, key, "GET", f"/v1/notifications/{row_id}")
    assert read.status_code == 200
    assert read.json()["status"] == "pending"
    assert read.json()["history"] == []
    assert "ann@example.com" not in read.text  # the address is not read back

    cancelled = call(api, key, "POST", f"/v1/notifications/{row_id}/cancel")
    assert cancelled.json() == {"id": row_id, "status": "cancelled"}
    again = call(api, key, "POST", f"/v1/notifications/{row_id}/cancel")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "final"


def test_an_idempotency_key_writes_once_replays_the_same_body_and_refuses_another(
    api: str, make_key: MakeKey, engine: Engine
) -> None:
    key = make_key()
    first = call(
        api, key, "POST", "/v1/notifications", json=MAIL, headers={"Idempotency-Key": "k1"}
    )
    assert first.status_code == 201
    assert "Idempotent-Replayed" not in first.headers
    # the same request, spelt otherwise (key order, spaces): answered as the first was
    same = json.dumps(dict(reversed(list(MAIL.items()))), indent=2)
    replay = call(
        api,
        key,
        "POST",
        "/v1/notifications",
        content=same,
        headers={"Idempotency-Key": "k1", "Content-Type": "application/json"},
    )
    assert replay.status_code == 201
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json() == {**first.json(), "replayed": True}
    other = call(
        api, key, "POST", "/v1/notifications", json={**MAIL, "body": "Other"},
        headers={"Idempotency-Key": "k1"},
    )  # fmt: skip
    assert other.status_code == 422
    assert other.json()["error"] == {
        "code": "idempotency_key_reused",
        "message": "this idempotency key was used for another request: give each new"
        " notification a key of its own",
        "field": "Idempotency-Key",
    }
    assert [(r[1], r[2]) for r in rows(engine)] == [("billing", "billing:k1")]
    by_key = call(api, key, "GET", "/v1/notifications", params={"idempotency_key": "k1"})
    assert by_key.json()["id"] == first.json()["id"]
    assert by_key.json()["idempotency_key"] == "k1"


def test_a_key_is_kept_after_its_row_is_purged_and_after_its_checks_changed(
    api: str, make_key: MakeKey, engine: Engine
) -> None:
    key = make_key()
    made = [
        call(api, key, "POST", "/v1/notifications", json=MAIL, headers={"Idempotency-Key": "g1"}),
        call(api, key, "POST", "/v1/notifications/batch",
             json={"notifications": [{**MAIL, "idempotency_key": "g2"}]}),
    ]  # fmt: skip
    ids = [made[0].json()["id"], made[1].json()["results"][0]["id"]]
    with engine.begin() as conn:  # as the purge of finished rows does, past their retention
        assert conn.execute(text("DELETE FROM notifications")).rowcount == 2
    again = call(
        api, key, "POST", "/v1/notifications", json=MAIL, headers={"Idempotency-Key": "g1"}
    )
    assert (again.status_code, again.json()) == (
        201, {"id": ids[0], "idempotency_key": "g1", "replayed": True}
    )  # fmt: skip
    items = [
        {**MAIL, "idempotency_key": "g2"},  # a replay
        {**MAIL, "idempotency_key": "g1", "body": "Other"},  # another request: refused
        {**MAIL, "idempotency_key": "g3", "channel": "pigeon"},  # refused by its checks
        {**MAIL, "idempotency_key": "g1", "channel": "pigeon"},  # refused, and reused
    ]
    batch = call(api, key, "POST", "/v1/notifications/batch", json={"notifications": items})
    results = batch.json()["results"]
    assert [r["status"] for r in results] == ["replayed", "refused", "refused", "refused"]
    assert results[0]["id"] == ids[1]
    codes = [r["error"]["code"] for r in results[1:]]
    assert codes == ["idempotency_key_reused", "invalid_notification", "idempotency_key_reused"]
    assert rows(engine) == []  # nothing written again


def test_a_producer_cannot_write_a_request_hash_to_pass_its_row_off_as_a_request(
    api: str, make_key: MakeKey, engine: Engine, database_url: str
) -> None:
    """Only the API writes ``request_hash``: a row a producer wrote with an API key's
    ``dedupe_key`` stays a SQL producer's (``key_in_use``), whatever it tries."""
    from notifier.db import make_engine

    key = make_key("billing")
    logins = Logins(engine, database_url)
    try:
        user = logins.make("notifier_producer")
        with engine.begin() as conn:  # the producer writes as "billing", as its admin set
            conn.execute(text(f"ALTER ROLE {user} SET notifier.producer = 'billing'"))
        producer = make_engine(logins.url(user))
        forged = bodies.request_hash(MAIL)
        with pytest.raises(DBAPIError, match="permission denied"), producer.begin() as conn:
            conn.execute(
                text("INSERT INTO notifications (channel, recipient, dedupe_key, request_hash)"
                     " VALUES ('email', 'ann@example.com', 'billing:p1', :hash)"),
                {"hash": forged},
            )  # fmt: skip
        with producer.begin() as conn:
            conn.execute(
                text("INSERT INTO notifications (channel, recipient, subject, body, dedupe_key)"
                     " VALUES ('email', 'ann@example.com', 'Hi', 'Welcome', 'billing:p1')")
            )  # fmt: skip
        producer.dispose()
    finally:
        logins.drop()
    asked = call(api, key, "POST", "/v1/notifications", json=MAIL,
                 headers={"Idempotency-Key": "p1"})  # fmt: skip
    assert (asked.status_code, asked.json()["error"]["code"]) == (409, "key_in_use")


def test_concurrent_requests_with_one_key_write_one_row(
    api: str, make_key: MakeKey, engine: Engine
) -> None:
    key = make_key()
    answers: list[httpx.Response] = []
    start = threading.Barrier(8)

    def send() -> None:
        start.wait()
        answers.append(
            call(api, key, "POST", "/v1/notifications", json=MAIL, headers={"Idempotency-Key": "c"})
        )

    threads = [threading.Thread(target=send) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    statuses = sorted(a.status_code for a in answers)
    assert len(statuses) == 8
    assert set(statuses) <= {201, 409}
    assert 201 in statuses
    for a in answers:
        if a.status_code == 409:
            assert a.json()["error"]["code"] == "in_progress"
            assert a.headers["Retry-After"] == "1"
    assert len(rows(engine)) == 1


def test_a_single_request_holds_its_key_in_the_statement_that_writes_its_row(
    api: str, make_key: MakeKey, engine: Engine
) -> None:
    """A single request's key is held, and its row written as its key's producer's, by one
    statement: while another transaction holds the key the request is told to come back and
    nothing is written; once it is free the row is written, and nothing of the request is
    left held or named on the connection it was written on."""
    key, idem = make_key("billing"), {"Idempotency-Key": "held"}
    lock = text("SELECT pg_advisory_xact_lock(hashtextextended('billing:held', 26))")
    with engine.begin() as holder:
        holder.execute(lock)
        waited = call(api, key, "POST", "/v1/notifications", json=MAIL, headers=idem)
        assert (waited.status_code, waited.json()["error"]["code"]) == (409, "in_progress")
        assert waited.headers["Retry-After"] == "1"
        assert rows(engine) == []
    made = call(api, key, "POST", "/v1/notifications", json=MAIL, headers=idem)
    assert made.status_code == 201
    assert [(r[1], r[2]) for r in rows(engine)] == [("billing", "billing:held")]
    with engine.begin() as other:  # the key is free again: the request's transaction ended
        assert other.execute(
            text("SELECT pg_try_advisory_xact_lock(hashtextextended('billing:held', 26))")
        ).scalar_one()
    plain = call(api, key, "POST", "/v1/notifications", json={**MAIL, "to": "bo@example.com"})
    assert plain.status_code == 201
    assert {r[1] for r in rows(engine)} == {"billing"}


def test_a_key_reads_and_cancels_only_its_own_rows(
    api: str, make_key: MakeKey, engine: Engine
) -> None:
    billing, shipping = make_key("billing"), make_key("shipping")
    mine = call(api, billing, "POST", "/v1/notifications", json=MAIL,
                headers={"Idempotency-Key": "same"}).json()["id"]  # fmt: skip
    theirs = call(api, shipping, "POST", "/v1/notifications", json=MAIL,
                  headers={"Idempotency-Key": "same"})  # fmt: skip
    assert theirs.status_code == 201  # keys of two producers never meet
    for method, path in [
        ("GET", f"/v1/notifications/{mine}"),
        ("POST", f"/v1/notifications/{mine}/cancel"),
    ]:
        answer = call(api, shipping, method, path)
        assert answer.status_code == 404
        assert answer.json()["error"]["code"] == "not_found"
    assert call(api, shipping, "POST", "/v1/notifications/cancel",
                json={"idempotency_key": "same"}).status_code == 200  # fmt: skip
    statuses = {r[2]: r[4] for r in rows(engine)}
    assert statuses == {"billing:same": "pending", "shipping:same": "cancelled"}


@pytest.mark.parametrize(
    ("scopes", "body", "field"),
    [
        ({"read_only": True}, MAIL, None),
        ({"channels": ["sms"]}, MAIL, "channel"),
        ({"categories": ["billing"]}, {**MAIL, "category": "marketing"}, "category"),
    ],
)
def test_a_key_writes_only_within_its_scope(
    api: str, make_key: MakeKey, engine: Engine, scopes: dict[str, Any], body: Any, field: Any
) -> None:
    refused = call(api, make_key(**scopes), "POST", "/v1/notifications", json=body)
    assert refused.status_code == 403
    assert refused.json()["error"]["field"] == field
    assert rows(engine) == []


def test_no_key_a_wrong_key_and_a_revoked_key_are_refused(
    api: str, make_key: MakeKey, engine: Engine
) -> None:
    key = make_key()
    assert call(api, None, "POST", "/v1/notifications", json=MAIL).status_code == 401
    wrong = key[:-4] + ("AAAA" if not key.endswith("AAAA") else "BBBB")
    assert call(api, wrong, "POST", "/v1/notifications", json=MAIL).status_code == 401
    with engine.begin() as conn:
        assert api_db.revoke_key(conn, keys.prefix_of(key) or "")
    refused = call(api, key, "POST", "/v1/notifications", json=MAIL)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "unauthorized"
    assert rows(engine) == []


@pytest.mark.parametrize(
    ("body", "status", "code", "field"),
    [
        (b"{", 400, "invalid_json", None),
        (b"[" * 100 + b"]" * 100, 400, "too_deep", None),
        (b'{"channel": "email", "to": "a@b.c", "priority": NaN}', 400, "invalid_json", None),
        (b"\xff", 400, "invalid_json", None),
        (b"[]", 422, "invalid_body", None),
        (b'{"channel": "email", "to": "a@b.c", "subjet": "x"}', 422, "unknown_field", "subjet"),
        (b'{"to": "a@b.c"}', 422, "invalid_field", "channel"),
        (b'{"channel": "email", "to": 5}', 422, "invalid_field", "to"),
        (
            b'{"channel": "email", "to": "a@b.c", "send_at": "2026-12-24T18:00"}',
            422,
            "invalid_field",
            "send_at",
        ),
        (
            b'{"channel": "email", "to": "a@b.c", "max_attempts": true}',
            422,
            "invalid_field",
            "max_attempts",
        ),
        (b'{"channel": "fax", "to": "a@b.c", "body": "x"}', 422, "invalid_notification", None),
        (
            b'{"channel": "email", "to": "not an address", "body": "x"}',
            422,
            "invalid_notification",
            None,
        ),
    ],
)
def test_bad_requests_get_a_clear_error_and_write_nothing(
    api: str, make_key: MakeKey, engine: Engine, body: bytes, status: int, code: str, field: Any
) -> None:
    answer = call(
        api, make_key(), "POST", "/v1/notifications", content=body,
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["code"] == code
    assert answer.json()["error"]["field"] == field
    assert rows(engine) == []


def test_the_edges_of_a_request_are_refused_before_the_body_is_read(
    api: str, make_key: MakeKey
) -> None:
    key = make_key()
    plain = call(
        api, key, "POST", "/v1/notifications", content=b"x", headers={"Content-Type": "text/plain"}
    )
    assert plain.status_code == 415
    big = call(api, key, "POST", "/v1/notifications", content=b" " * (4 * 1024 * 1024 + 1),
               headers={"Content-Type": "application/json"})  # fmt: skip
    assert big.status_code == 413
    long_key = call(api, key, "POST", "/v1/notifications", json=MAIL,
                    headers={"Idempotency-Key": "k" * 256})  # fmt: skip
    assert long_key.json()["error"]["code"] == "invalid_idempotency_key"
    nowhere = call(api, key, "GET", "/v1/nothing")
    assert (nowhere.status_code, nowhere.json()["error"]["code"]) == (404, "not_found")
    assert call(api, key, "GET", "/v1/notifications/abc").status_code == 404
    assert call(api, key, "DELETE", "/v1/notifications/1").status_code == 405


def test_a_batch_writes_each_item_or_refuses_it_on_its_own(
    api: str, make_key: MakeKey, engine: Engine
) -> None:
    key = make_key()
    items = [
        {**MAIL, "idempotency_key": "b1"},
        {**MAIL, "to": "not an address"},
        {**MAIL, "idempotency_key": "b1"},
        "not an object",
        {**MAIL, "to": "bob@example.com"},
    ]
    answer = call(api, key, "POST", "/v1/notifications/batch", json={"notifications": items})
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [r["status"] for r in results] == [
        "created",
        "refused",
        "replayed",
        "refused",
        "created",
    ]
    assert results[1]["error"]["code"] == "invalid_notification"
    assert results[2]["id"] == results[0]["id"]
    assert [r[3] for r in rows(engine)] == ["ann@example.com", "bob@example.com"]
    too_many = call(api, key, "POST", "/v1/notifications/batch",
                    json={"notifications": [MAIL] * 1001})  # fmt: skip
    assert too_many.status_code == 422


def test_a_batch_answer_closes_its_connection_and_a_single_one_keeps_it(
    api: str, make_key: MakeKey
) -> None:
    """So that a client's next batch is accepted anew, by whichever API process is free; a
    single request's connection is kept for the next (it costs more than its request)."""
    key = make_key()
    address = httpx.URL(api)
    body = json.dumps({"notifications": [MAIL]}).encode()
    head = (
        f"POST /v1/notifications/batch HTTP/1.1\r\nHost: {address.host}\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection((address.host, address.port), timeout=10) as sock:
        sock.sendall(head.encode() + body)
        answer = b""
        while chunk := sock.recv(65536):  # until the server closes it
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert b"\r\nconnection: close\r\n" in answer.lower()
    plain = http.client.HTTPConnection(address.host, address.port, timeout=10)
    sockets = []
    try:
        for n in range(2):
            headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": f"one-{n}"}
            headers["Content-Type"] = "application/json"
            plain.request("POST", "/v1/notifications", body=json.dumps(MAIL), headers=headers)
            single = plain.getresponse()
            assert single.status == 201
            assert not single.will_close, single.getheaders()
            single.read()
            sockets.append(plain.sock)
    finally:
        plain.close()
    assert sockets[0] is not None
    assert sockets[1] is sockets[0]  # the second request went on the first one's connection


def test_a_key_over_its_rate_is_told_when_to_come_back(
    engine: Engine, make_settings: MakeSettings, redis_url: str, make_key: MakeKey
) -> None:
    counter = redis.Redis.from_url(redis_url, socket_timeout=2)
    now = [datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)]
    app = create_app(make_settings(), engine, counter, clock=lambda: now[0])
    key, other = make_key(per_second=2), make_key("shipping", per_second=2)
    with serving(app, free_port()) as url:
        statuses = [call(url, key, "GET", "/v1/notifications/1").status_code for _ in range(5)]
        refused = call(url, key, "GET", "/v1/notifications/1")
        others = call(url, other, "GET", "/v1/notifications/1").status_code
        now[0] += timedelta(seconds=1)
        later = call(url, key, "GET", "/v1/notifications/1").status_code
    assert statuses == [404, 404, 429, 429, 429]  # two a second, counted in Redis
    assert refused.headers["Retry-After"] == "1"
    assert refused.json()["error"]["code"] == "rate_limited"
    assert (others, later) == (404, 404)  # each key its own count, each second anew
    counts = list(counter.scan_iter("notifier:api:rate:*"))
    assert len(counts) == 3  # a key's second, the other key's, and the key's next second
    ttls = [counter.ttl(name) for name in counts]
    assert all(isinstance(t, int) and 0 < t <= 2 for t in ttls)  # each forgotten by itself


def test_a_write_over_its_rate_writes_nothing(
    engine: Engine, make_settings: MakeSettings, redis_url: str, make_key: MakeKey
) -> None:
    counter = redis.Redis.from_url(redis_url, socket_timeout=2)
    now = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)
    app = create_app(make_settings(), engine, counter, clock=lambda: now)
    key = make_key(per_second=1)
    with serving(app, free_port()) as url:  # the key is read on the write's own connection
        answers = [
            call(url, key, "POST", "/v1/notifications", json={**MAIL, "to": to},
                 headers={"Idempotency-Key": to})
            for to in ("ann@example.com", "bob@example.com")
        ]  # fmt: skip
    assert [a.status_code for a in answers] == [201, 429]
    assert [r[3] for r in rows(engine)] == ["ann@example.com"]  # counted before it is written


def test_a_write_goes_on_uncounted_when_redis_does_not_answer(
    engine: Engine, make_settings: MakeSettings, make_key: MakeKey, caplog: pytest.LogCaptureFixture
) -> None:
    """The rate is not counted without Redis: the producer's row is written, not refused."""
    gone = redis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=2)
    with pytest.raises(redis.ConnectionError):
        gone.ping()  # nothing listens there
    app = create_app(make_settings(), engine, gone)
    with serving(app, free_port()) as url:
        made = call(url, make_key(), "POST", "/v1/notifications", json=MAIL)
    assert made.status_code == 201
    assert [r[3] for r in rows(engine)] == ["ann@example.com"]
    assert "API rate limit not counted, Redis unavailable" in caplog.text


def test_an_outage_is_a_503_not_a_500(make_settings: MakeSettings, make_key: MakeKey) -> None:
    from notifier.db import make_engine

    gone = make_engine("postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=2")
    app = create_app(make_settings(), gone, None)
    with serving(app, free_port()) as url:
        ready = httpx.get(url + "/ready", timeout=10)
        written = call(url, make_key(), "POST", "/v1/notifications", json=MAIL)
        keyless = [
            call(url, key, "POST", "/v1/notifications", json=MAIL) for key in (None, "nk_short")
        ]
    assert (ready.status_code, ready.json()["error"]["code"]) == (503, "unavailable")
    assert ready.headers["Retry-After"] == "5"
    assert written.status_code == 503
    # a request without a key in a key's form is told so, the database not asked
    assert [(a.status_code, a.json()["error"]["code"]) for a in keyless] == [
        (401, "unauthorized"),
        (401, "unauthorized"),
    ]
    gone.dispose()


def test_the_document_served_is_the_one_in_the_repository(api: str) -> None:
    served = httpx.get(api + "/openapi.json", timeout=10).json()
    kept = json.loads((ROOT / "docs" / "openapi.json").read_text())
    assert served == kept == openapi.document(), (
        "docs/openapi.json is stale: notifier api --print-openapi > docs/openapi.json"
    )


def test_the_api_runs_as_a_notifier_api_login_which_may_do_nothing_more(
    engine: Engine, database_url: str, make_settings: MakeSettings, make_key: MakeKey
) -> None:
    from notifier.db import make_engine

    logins = Logins(engine, database_url)
    with engine.connect() as conn:  # a hardened database: temporary tables by grant only
        database = conn.execute(text("SELECT current_database()")).scalar_one()
    hardened = f'TEMPORARY ON DATABASE "{database}"'
    try:
        with engine.begin() as conn:
            conn.execute(text(f"REVOKE {hardened} FROM PUBLIC"))
        user = logins.make("notifier_api")
        as_api = make_engine(logins.url(user))
        key = make_key("billing")
        with serving(create_app(make_settings(), as_api, None), free_port()) as url:
            made = call(url, key, "POST", "/v1/notifications", json=MAIL,
                        headers={"Idempotency-Key": "r1"})  # fmt: skip
            assert made.status_code == 201, made.text
            row_id = made.json()["id"]
            many = call(url, key, "POST", "/v1/notifications/batch",
                        json={"notifications": [MAIL, MAIL]})  # fmt: skip
            assert [r["status"] for r in many.json()["results"]] == ["created"] * 2, many.text
            for one in many.json()["results"]:
                assert call(url, key, "POST", f"/v1/notifications/{one['id']}/cancel").is_success
            assert call(url, key, "GET", f"/v1/notifications/{row_id}").status_code == 200
            assert call(url, key, "POST", f"/v1/notifications/{row_id}/cancel").status_code == 200
        assert rows(engine)[0] == (row_id, "billing", "billing:r1", "ann@example.com", "cancelled")
        for statement in (
            "DELETE FROM notifications",
            "UPDATE notifications SET status = 'sent', sent_at = now()",
            "INSERT INTO api_keys (name, prefix, secret_hash) VALUES ('x', 'x', '\\x00')",
            "UPDATE notifications SET attempts = 0",
            "DELETE FROM api_requests",
        ):
            refused = "permission denied|violates row-level security"
            with pytest.raises(DBAPIError, match=refused), as_api.begin() as conn:
                conn.execute(text(statement))
        with as_api.begin() as conn:  # a cancelled row sent after all: row-level security
            conn.execute(text("UPDATE notifications SET status = 'pending'"))
        assert {r[4] for r in rows(engine)} == {"cancelled"}
        as_api.dispose()
    finally:
        logins.drop()
        with engine.begin() as conn:
            conn.execute(text(f"GRANT {hardened} TO PUBLIC"))


def _refuse_a_recipient(engine: Engine) -> None:
    """A fault for real: the database refuses a row for refused@example.com."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "CREATE FUNCTION refuse_row() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                " IF NEW.recipient = 'refused@example.com' THEN"
                " RAISE EXCEPTION 'this recipient is refused'; END IF; RETURN NEW; END $$;"
                " CREATE TRIGGER refuse_row BEFORE INSERT ON notifications"
                " FOR EACH ROW EXECUTE FUNCTION refuse_row()"
            )
        )


def test_a_row_the_database_refuses_is_refused_alone_in_its_batch(
    api: str, make_key: MakeKey, engine: Engine
) -> None:
    _refuse_a_recipient(engine)
    items = [
        {**MAIL, "idempotency_key": "a"},
        {**MAIL, "to": "refused@example.com"},
        {**MAIL, "to": "bob@example.com", "idempotency_key": "a"},  # the same key, another body
        {**MAIL, "to": "carol@example.com"},
    ]
    answer = call(api, make_key(), "POST", "/v1/notifications/batch", json={"notifications": items})
    results = answer.json()["results"]
    assert [r["status"] for r in results] == ["created", "refused", "refused", "created"]
    assert results[1]["error"]["message"] == ("the database refused it: this recipient is refused")
    assert results[2]["error"]["code"] == "idempotency_key_reused"
    assert [r[3] for r in rows(engine)] == ["ann@example.com", "carol@example.com"]
    replay = call(api, make_key("billing"), "POST", "/v1/notifications", json=MAIL,
                  headers={"Idempotency-Key": "a"})  # fmt: skip
    assert replay.json() == {"id": results[0]["id"], "idempotency_key": "a", "replayed": True}


def test_a_single_row_the_database_refuses_is_refused_and_its_key_left_free(
    api: str, make_key: MakeKey, engine: Engine
) -> None:
    _refuse_a_recipient(engine)
    key, idem = make_key(), {"Idempotency-Key": "k1"}
    refused = call(api, key, "POST", "/v1/notifications",
                   json={**MAIL, "to": "refused@example.com"}, headers=idem)  # fmt: skip
    assert refused.status_code == 422
    assert refused.json()["error"] == {
        "code": "invalid_notification",
        "message": "the database refused it: this recipient is refused",
        "field": None,
    }
    assert rows(engine) == []
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM api_requests")).scalar_one() == 0
    made = call(api, key, "POST", "/v1/notifications", json=MAIL, headers=idem)
    assert made.status_code == 201  # the key was not kept for the refused request
    assert made.json()["replayed"] is False
    assert [r[3] for r in rows(engine)] == ["ann@example.com"]


def test_the_documented_curl_example_works_as_written(
    api: str, make_key: MakeKey, engine: Engine
) -> None:
    readme = (ROOT / "README.md").read_text()
    [example] = re.findall(r"```sh\ncurl -X POST (\S+) .*?-d '([^']+)'\n```", readme, re.S)
    url, body = example
    path = url.removeprefix("https://notify.example.com")
    headers = dict(re.findall(r'-H "([^:]+): ([^"]+)"', readme.split("```sh\ncurl")[1]))
    key = make_key()
    headers = {name: value.replace("$NOTIFIER_API_KEY", key) for name, value in headers.items()}
    answer = httpx.post(api + path, content=body, headers=headers, timeout=10)
    assert answer.status_code == 201, answer.text
    assert [(r[2], r[4]) for r in rows(engine)] == [("billing:welcome:user:42", "pending")]


def test_a_statement_past_its_timeout_is_a_503_and_writes_nothing(
    engine: Engine, database_url: str, make_settings: MakeSettings, make_key: MakeKey
) -> None:
    from notifier.db import make_engine

    slow_inserts(engine, 2)  # a fault for real: every insert takes 2 s
    hurried = make_engine(database_url, statement_timeout=0.5)
    key = make_key()
    with serving(create_app(make_settings(), hurried, None), free_port()) as url:
        answer = call(url, key, "POST", "/v1/notifications", json=MAIL)
    hurried.dispose()
    assert (answer.status_code, answer.json()["error"]["code"]) == (503, "unavailable")
    assert answer.headers["Retry-After"] == "5"
    assert rows(engine) == []
