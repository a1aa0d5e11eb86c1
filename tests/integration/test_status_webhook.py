"""The status webhook: events written with every change that finishes a row, on every path, and
POSTed signed to real receivers on loopback that answer well, badly or not at all."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import redis
import sqlalchemy
from sqlalchemy import Engine, text

import notifier
from notifier import metrics, ops, status_webhook
from notifier.db import events as events_db
from notifier.db import status_events as queries
from notifier.db.rescue import rescue_expired
from notifier.delivery.dispatcher import Dispatcher
from notifier.providers import load_registry
from notifier.settings import Settings, get_settings
from tests.commands import run
from tests.migrations import migrate
from tests.prometheus import samples, scrape
from tests.raw_server import RawServer, silence
from tests.receiver import Receiver

SECRET = "whsec_" + base64.b64encode(b"status-webhook-test-key-32-bytes").decode()


def verify(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """docs/delivery-feedback.md's verification, as a producer would run it."""
    key = (
        base64.b64decode(secret.removeprefix("whsec_"))
        if secret.startswith("whsec_")
        else secret.encode()
    )
    if abs(time.time() - int(headers["webhook-timestamp"])) > 300:
        return False
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(
        hmac.compare_digest(expected, s.removeprefix("v1,"))
        for s in headers["webhook-signature"].split()
    )


def _on(settings: Settings, url: str, **more: Any) -> Settings:
    update = {
        "status_webhook_url": url,
        "status_webhook_secret": SECRET,
        "webhook_timeout": 1.0,
        **more,
    }
    return settings.model_copy(update=update)


def _rows(engine: Engine, *keys: str, status: str = "pending", channel: str = "null") -> None:
    with engine.begin() as conn:
        for key in keys:
            conn.execute(
                text(
                    "INSERT INTO notifications (channel, recipient, dedupe_key, status,"
                    " claim_token, locked_until) VALUES (:channel, :key, :key, :status,"
                    " CASE WHEN :status = 'processing' THEN gen_random_uuid() END,"
                    " CASE WHEN :status = 'processing' THEN now() + interval '1 minute' END)"
                ),
                {"channel": channel, "key": key, "status": status},
            )


def _cancel(engine: Engine, key: str) -> None:
    """A producer's cancel in plain SQL, as the README writes it."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE notifications SET status = 'cancelled', last_error = 'user confirmed',"
                " updated_at = now() WHERE dedupe_key = :key AND status = 'pending'"
            ),
            {"key": key},
        )


def _with_events(engine: Engine, settings: Settings, url: str, *keys: str, **more: Any) -> Settings:
    """The webhook configured at ``url``, and one row cancelled per key: an event each."""
    on = _on(settings, url, **more)
    status_webhook.configure(engine, on)
    _rows(engine, *keys)
    for key in keys:
        _cancel(engine, key)
    return on


def _events(engine: Engine) -> list[tuple[str | None, str, str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT dedupe_key, kind, state, status FROM status_events ORDER BY id")
        ).all()
    return [tuple(r) for r in rows]  # type: ignore[misc]


def _trigger_there(engine: Engine) -> bool:
    with engine.connect() as conn:
        found = conn.execute(
            text("SELECT count(*) FROM pg_trigger WHERE tgname = 'notifications_status_events'")
        ).scalar_one()
    return bool(found)


def _dispatch(engine: Engine, settings: Settings) -> None:
    dispatcher = Dispatcher(engine, load_registry(get_settings()), settings)
    try:
        while dispatcher.run_once().claimed:
            pass
    finally:
        dispatcher.close()


def test_nothing_is_written_until_a_worker_configures_a_url(
    engine: Engine, settings: Settings
) -> None:
    assert not _trigger_there(engine)  # as the migration leaves it: no cost to any UPDATE
    assert status_webhook.configure(engine, settings) is False  # no URL: stays off, untouched
    _rows(engine, "before")
    _cancel(engine, "before")
    assert _events(engine) == []

    on = _on(settings, "http://127.0.0.1:9/hook")
    assert status_webhook.configure(engine, on) is True
    assert status_webhook.configure(engine, on) is False  # the same again changes nothing
    assert _trigger_there(engine)
    _rows(engine, "after", "rolled-back")
    _cancel(engine, "after")
    with engine.connect() as conn:  # a producer's transaction that rolls back after its cancel
        conn.execute(text("UPDATE notifications SET status = 'cancelled', last_error = 'x'"))
        conn.rollback()
    assert _events(engine) == [("after", "status", "cancelled", "pending")]

    assert status_webhook.configure(engine, settings) is True  # a worker without the URL
    assert not _trigger_there(engine)
    _cancel(engine, "rolled-back")
    assert len(_events(engine)) == 1


def test_every_path_that_finishes_a_row_writes_its_event(
    engine: Engine, settings: Settings
) -> None:
    status_webhook.configure(engine, _on(settings, "http://127.0.0.1:9/hook"))
    _rows(engine, "sent", "dead-channel", "expired", "by-key", "by-operator", "by-operator-2")
    _rows(engine, "to-rescue", status="processing")
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE notifications SET channel = 'pigeon' WHERE dedupe_key = 'dead-channel'")
        )
        conn.execute(
            text(
                "UPDATE notifications SET expires_at = now() - interval '1 minute'"
                " WHERE dedupe_key = 'expired'"
            )
        )
        # a worker that died holding this row, on its last attempt
        conn.execute(
            text(
                "UPDATE notifications SET attempts = 5, locked_until = now() - interval '1 second'"
                " WHERE dedupe_key = 'to-rescue'"
            )
        )
        conn.execute(text("UPDATE notifications SET channel = channel"))  # no change: no event
    with engine.begin() as conn:
        assert notifier.cancel(conn, "by-key", "user confirmed")
    with engine.begin() as conn:
        assert rescue_expired(conn) == {"pending": 0, "dead": 1}
        conn.execute(
            text(
                "UPDATE notifications SET status = 'processing', claim_token = gen_random_uuid(),"
                " locked_until = now() + interval '1 minute'"
                " WHERE dedupe_key IN ('by-operator', 'by-operator-2')"
            )
        )
    processing = ops.WaitingFilter(statuses=("processing",))
    count, snap = ops.count_cancel(engine, processing)
    assert count == 2
    assert ops.cancel(engine, processing, snap, "operator").changed == 2
    _dispatch(engine, settings)
    with engine.begin() as conn:
        row_id = conn.execute(text("SELECT id FROM notifications WHERE dedupe_key = 'sent'"))
        sent_id = row_id.scalar_one()
        events_db.advance(conn, sent_id, "delivered", datetime.now(UTC), "250 ok")
        events_db.advance(conn, sent_id, "delivered", datetime.now(UTC), "again")  # no change
        events_db.advance(conn, sent_id, "bounced", datetime.now(UTC), "550 no such user")

    found = sorted((key or "", kind, state) for key, kind, state, _ in _events(engine))
    assert found == [
        ("by-key", "status", "cancelled"),
        ("by-operator", "status", "cancelled"),
        ("by-operator-2", "status", "cancelled"),
        ("dead-channel", "status", "dead"),
        ("expired", "status", "cancelled"),
        ("sent", "delivery", "bounced"),
        ("sent", "delivery", "delivered"),
        ("sent", "status", "sent"),
        ("to-rescue", "status", "dead"),
    ]


def test_only_the_events_asked_for_are_written(engine: Engine, settings: Settings) -> None:
    status_webhook.configure(
        engine, _on(settings, "http://127.0.0.1:9/hook", status_webhook_events=["dead", "bounced"])
    )
    _rows(engine, "cancelled", "sent")
    _cancel(engine, "cancelled")
    _dispatch(engine, settings)
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE notifications SET status = 'dead', last_error = 'operator', sent_at = NULL"
                " WHERE dedupe_key = 'sent'"
            )
        )
        sent_id = conn.execute(text("SELECT id FROM notifications WHERE dedupe_key = 'sent'"))
        events_db.advance(conn, sent_id.scalar_one(), "bounced", datetime.now(UTC), "550")
    assert [(k, s) for k, _, s, _ in _events(engine)] == [("sent", "dead"), ("sent", "bounced")]
    unknown = "unknown status webhook events"
    with pytest.raises(sqlalchemy.exc.DBAPIError, match=unknown), engine.begin() as conn:
        queries.configure(conn, ["sent", "opened"])


def test_producers_fire_the_trigger_but_cannot_write_events(
    engine: Engine, settings: Settings
) -> None:
    status_webhook.configure(engine, _on(settings, "http://127.0.0.1:9/hook"))
    _rows(engine, "k")
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL ROLE notifier_producer"))
        conn.execute(
            text(
                "UPDATE notifications SET status = 'cancelled', last_error = 'user confirmed',"
                " updated_at = now() WHERE dedupe_key = 'k' AND status = 'pending'"
            )
        )
    forged = text(
        "INSERT INTO status_events (notification_id, kind, state, channel, occurred_at)"
        " VALUES (1, 'status', 'sent', 'null', now())"
    )
    with engine.connect() as conn:
        conn.execute(text("SET LOCAL ROLE notifier_producer"))
        with pytest.raises(sqlalchemy.exc.ProgrammingError, match="permission denied"):
            conn.execute(forged)
        conn.rollback()
    assert _events(engine) == [("k", "status", "cancelled", "pending")]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


@pytest.mark.timeout(60)
def test_events_are_posted_together_signed_as_webhooks_are(
    engine: Engine, settings: Settings, receiver: Receiver
) -> None:
    on = _on(settings, receiver.url)
    status_webhook.configure(engine, on)
    _rows(engine, "a", "b")
    _cancel(engine, "a")
    _dispatch(engine, settings)

    report = status_webhook.deliver(engine, on)

    assert (report.claimed, report.sent) == (2, 2)
    [(headers, body)] = receiver.requests
    with engine.connect() as conn:
        ids = conn.execute(text("SELECT id FROM status_events ORDER BY id")).scalars().all()
    assert headers["webhook-id"] == f"status-events-{ids[0]}-{ids[1]}"
    assert verify(SECRET, headers, body)
    assert not verify(SECRET, headers, body.replace(b"notification.", b"notification!"))
    first, second = json.loads(body)["events"]
    assert first == {
        "id": f"status-event-{ids[0]}",
        "type": "notification.status",
        "notification_id": first["notification_id"],
        "dedupe_key": "a",
        "channel": "null",
        "state": "cancelled",
        "detail": "user confirmed",
        "at": first["at"],
    }
    assert (second["id"], second["dedupe_key"], second["state"], second["detail"]) == (
        f"status-event-{ids[1]}",
        "b",
        "sent",
        None,
    )
    assert datetime.fromisoformat(second["at"]).tzinfo is not None
    assert {s for *_, s in _events(engine)} == {"sent"}
    assert status_webhook.deliver(engine, on).claimed == 0  # nothing is sent twice


@pytest.mark.timeout(60)
def test_a_batch_goes_out_in_requests_of_at_most_a_hundred_events(
    engine: Engine, settings: Settings, receiver: Receiver
) -> None:
    keys = [f"k{i}" for i in range(250)]
    on = _with_events(engine, settings, receiver.url, *keys)
    assert status_webhook.deliver(engine, on).sent == 250
    sizes = sorted(len(json.loads(body)["events"]) for _, body in receiver.requests)
    assert sizes == [50, 100, 100]
    ids = [e["id"] for _, body in receiver.requests for e in json.loads(body)["events"]]
    assert len(set(ids)) == 250


class _Faulty(ThreadingHTTPServer):
    """Answers each request as ``plan`` says for its event's dedupe key, and records it did."""

    daemon_threads = True
    request_queue_size = 64  # every request of a batch connects at once
    plan: dict[str, str]
    seen: list[str]
    huge_written: int
    stopping: threading.Event


HUGE = 512 * 1024 * 1024


class _FaultyHandler(BaseHTTPRequestHandler):
    server: _Faulty
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        [event] = json.loads(body)["events"]
        what = self.server.plan.get(event["dedupe_key"], "ok")
        self.server.seen.append(what)
        if what == "hang":
            self.server.stopping.wait(30)
            return
        if what == "huge":
            self.send_response(200)
            self.send_header("Content-Length", str(HUGE))
            self.end_headers()
            chunk = b"x" * 65536
            try:
                while self.server.huge_written < HUGE:
                    self.wfile.write(chunk)
                    self.server.huge_written += len(chunk)
            except OSError:  # the client stopped reading and closed
                pass
            return
        status, extra = {
            "ok": (200, {}),
            "500": (500, {}),
            "410": (410, {}),
            "redirect": (302, {"Location": "http://127.0.0.1:1/elsewhere"}),
        }[what]
        self.send_response(status)
        for name, value in extra.items():
            self.send_header(name, value)
        self.send_header("Content-Length", "4")
        self.end_headers()
        self.wfile.write(b"nope")

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def faulty() -> Iterator[_Faulty]:
    server = _Faulty(("127.0.0.1", 0), _FaultyHandler)
    server.plan, server.seen, server.huge_written = {}, [], 0
    server.stopping = threading.Event()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.stopping.set()
    server.shutdown()
    server.server_close()


@pytest.mark.timeout(60)
def test_a_bad_receiver_holds_back_only_the_request_it_mistreats(
    engine: Engine, settings: Settings, faulty: _Faulty
) -> None:
    url = f"http://127.0.0.1:{faulty.server_address[1]}/status"
    faulty.plan = {"hang": "hang", "500": "500", "410": "410", "redirect": "redirect"}
    faulty.plan["huge"] = "huge"
    on = _with_events(engine, settings, url, *faulty.plan, "ok-1", "ok-2", "ok-3")

    started = time.monotonic()
    report = status_webhook.deliver(engine, on, per_post=1)  # a request per event
    took = time.monotonic() - started

    assert sorted(faulty.seen) == sorted([*faulty.plan.values(), "ok", "ok", "ok"])
    assert 0 < faulty.huge_written < HUGE // 4  # its body was sent, and not read to the end
    assert took < 3 * on.webhook_timeout + 3  # the hang cost one timeout, not a queue of them
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT dedupe_key, status, attempts, last_error FROM status_events")
        ).all()
    got = {key: (status, attempts, error) for key, status, attempts, error in rows}
    assert got["hang"][:2] == ("pending", 1)
    assert "timed out (ReadTimeout) after the 1s limit" in got["hang"][2]
    assert got["500"][:2] == ("pending", 1)
    assert "HTTP 500" in got["500"][2]
    assert got["410"][:2] == ("dead", 1)
    assert got["410"][2].startswith("HTTP 410 from 127.0.0.1:")
    assert got["redirect"][:2] == ("dead", 1)
    assert "HTTP 302 redirect to http://127.0.0.1:1/elsewhere" in got["redirect"][2]
    for key in ("huge", "ok-1", "ok-2", "ok-3"):
        assert got[key] == ("sent", 1, None)
    assert (report.sent, report.retried, report.dead) == (4, 2, 2)


@pytest.mark.timeout(60)
def test_retries_back_off_and_give_up_with_the_reason_shown_to_operators(
    engine: Engine,
    settings: Settings,
    receiver: Receiver,
    redis_url: str,
    capsys: pytest.CaptureFixture[str],
    restore_logging: None,
) -> None:
    receiver.status = 503
    on = _with_events(engine, settings, receiver.url, "k", status_webhook_max_attempts=2)

    assert status_webhook.deliver(engine, on).retried == 1
    with engine.connect() as conn:
        wait = conn.execute(
            text("SELECT extract(epoch FROM next_attempt_at - now())::float8 FROM status_events")
        ).scalar_one()
    assert 0.5 < wait <= 1.0  # the first backoff: retry_base_seconds, less its jitter
    assert status_webhook.deliver(engine, on).claimed == 0  # not due yet
    time.sleep(wait + 0.1)
    assert status_webhook.deliver(engine, on).dead == 1

    assert receiver.arrived() == 2
    assert len({h["webhook-id"] for h, _ in receiver.requests}) == 1  # one id for both
    counts = status_webhook.counts(engine)
    assert (counts.pending, counts.processing, counts.dead) == (0, 0, 1)
    [dead] = status_webhook.dead_events(engine)
    assert dead["attempts"] == 2
    assert str(dead["last_error"]).startswith("gave up after 2 attempts; last error: HTTP 503")
    assert ops.stats(engine).status_events.dead == 1
    code, out, _ = run(capsys, "stats", "--json")
    assert code == 0
    assert json.loads(out)["status_events"]["dead"] == 1
    code, out, _ = run(capsys, "stats")
    assert code == 0
    assert "status webhook events: 0 pending (oldest 0s), 0 sending, 1 dead" in out

    client = redis.Redis.from_url(redis_url)
    found = samples(scrape(engine, client, metrics.Labels(frozenset(), frozenset())))
    client.close()
    assert found[("notifier_status_events", (("status", "dead"),))] == 1
    assert found[("notifier_status_events", (("status", "pending"),))] == 0

    receiver.status = 200
    assert status_webhook.requeue_dead(engine) == 1
    assert status_webhook.deliver(engine, on).sent == 1


@pytest.mark.timeout(60)
def test_events_of_a_sender_that_stopped_are_sent_again(
    engine: Engine, settings: Settings, receiver: Receiver
) -> None:
    on = _with_events(engine, settings, receiver.url, "k")
    with engine.begin() as conn:  # claimed by a sender whose lease has already run out
        assert len(queries.claim(conn, uuid.uuid4(), 10, -1)) == 1
    assert status_webhook.deliver(engine, on).sent == 1
    assert receiver.arrived() == 1
    with engine.connect() as conn:
        attempts = conn.execute(text("SELECT attempts FROM status_events")).scalar_one()
    assert attempts == 2


def test_a_malformed_url_sends_nothing_and_loses_nothing(
    engine: Engine, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    _with_events(engine, settings, "http://127.0.0.1:9/hook", "k")
    assert status_webhook.deliver(engine, _on(settings, "ftp://example.com/")).claimed == 0
    assert "NOTIFIER_STATUS_WEBHOOK_URL must be an absolute http(s) URL" in caplog.text
    assert [s for *_, s in _events(engine)] == ["pending"]


def test_purge_deletes_sent_and_dead_events_past_retention(
    engine: Engine, settings: Settings
) -> None:
    keys = ("old-sent", "old-dead", "old-pending", "new-sent")
    _with_events(engine, settings, "http://127.0.0.1:9/hook", *keys)
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE status_events SET status = CASE dedupe_key WHEN 'old-dead' THEN 'dead'"
                " WHEN 'old-pending' THEN 'pending' ELSE 'sent' END,"
                " last_error = 'HTTP 410', updated_at = CASE WHEN dedupe_key LIKE 'old-%'"
                " THEN now() - interval '400 days' ELSE now() END"
            )
        )
    result = ops.purge(engine, settings, batch_size=1)
    assert result.status_events == 2
    assert sorted(k or "" for k, *_ in _events(engine)) == ["new-sent", "old-pending"]


def test_the_migration_goes_down_and_up_again(engine: Engine, settings: Settings) -> None:
    _with_events(engine, settings, "http://127.0.0.1:9/hook", "k")
    migrate(engine, "0017")
    with engine.connect() as conn:
        left = conn.execute(
            text(
                "SELECT to_regclass('status_events'), to_regclass('status_webhook'),"
                " to_regprocedure('notifier_status_events()'),"
                " to_regprocedure('notifier_status_webhook(text[])')"
            )
        ).one()
    assert tuple(left) == (None, None, None, None)
    assert not _trigger_there(engine)
    _rows(engine, "after-down")
    _cancel(engine, "after-down")  # the table works without them
    migrate(engine, "head")
    assert not _trigger_there(engine)
    assert _events(engine) == []


def test_the_worker_role_switches_the_trigger_and_works_the_outbox(
    engine: Engine, settings: Settings
) -> None:
    _rows(engine, "k")
    token = uuid.uuid4()
    with engine.connect() as conn:
        conn.execute(text("SET LOCAL ROLE notifier_worker"))
        assert queries.configure(conn, ["cancelled"])
        assert queries.configured(conn) == ["cancelled"]
        conn.execute(
            text("UPDATE notifications SET status = 'cancelled', last_error = 'x' WHERE id > 0")
        )
        [event] = queries.claim(conn, token, 10, 60)
        assert queries.mark_sent(conn, token, [event.id]) == 1
        assert queries.counts(conn).pending == 0
        conn.commit()
    assert [s for *_, s in _events(engine)] == ["sent"]
    assert _trigger_there(engine)


@pytest.mark.timeout(60)
def test_while_notifications_wait_a_run_sends_one_batch_of_events(
    engine: Engine, settings: Settings, receiver: Receiver
) -> None:
    keys = [f"k{i}" for i in range(status_webhook.BATCH_SIZE + 20)]
    on = _with_events(engine, settings, receiver.url, *keys)
    _rows(engine, "due")  # a notification waiting to be sent: the dispatches go first
    assert status_webhook.deliver(engine, on, budget_seconds=5).claimed == len(keys) - 20
    assert status_webhook.deliver(engine, on).claimed == 20  # no budget: no yielding
    _rows(engine, "more-1", "more-2")
    _cancel(engine, "more-1")
    _cancel(engine, "more-2")
    _cancel(engine, "due")
    assert status_webhook.deliver(engine, on, budget_seconds=5).claimed == 3


@pytest.mark.timeout(60)
def test_a_run_returns_at_its_budget_and_a_hanging_request_is_recorded_later(
    engine: Engine, settings: Settings, raw_server: Callable[..., RawServer]
) -> None:
    """A beat-fired run keeps its process about ``RUN_SECONDS``, not a receiver's timeout: the
    request goes on without it and keeps its whole timeout, recorded as usual once it ends."""
    hanging = raw_server(silence)  # reads the request, answers nothing for 10 s
    on = _with_events(engine, settings, f"{hanging.url}/status", "k", webhook_timeout=4.0)
    finished = threading.Event()

    started = time.monotonic()
    report = status_webhook.deliver(engine, on, budget_seconds=0.3, finished=finished.set)
    took = time.monotonic() - started

    assert took < on.webhook_timeout / 2  # it did not wait for the read timeout
    assert (report.claimed, report.answering) == (0, 1)
    assert not finished.is_set()  # the run's request is still open
    assert [s for *_, s in _events(engine)] == ["processing"]
    assert finished.wait(30)
    assert time.monotonic() - started >= on.webhook_timeout  # its whole timeout, not the budget
    assert hanging.accepted == 1
    with engine.connect() as conn:
        status, attempts, error = conn.execute(
            text("SELECT status, attempts, last_error FROM status_events")
        ).one()
    assert (status, attempts) == ("pending", 1)
    assert "timed out (ReadTimeout) after the 4s limit" in error


def test_a_run_with_nothing_left_running_is_finished_when_it_returns(
    engine: Engine, settings: Settings, receiver: Receiver
) -> None:
    on = _with_events(engine, settings, receiver.url, "k")
    finished = threading.Event()
    report = status_webhook.deliver(engine, on, budget_seconds=30, finished=finished.set)
    assert (report.sent, report.answering, report.more_due) == (1, 0, False)
    assert finished.is_set()
    bad = _on(settings, "ftp://example.com/")  # nothing sent at all: finished all the same
    finished.clear()
    report = status_webhook.deliver(engine, bad, budget_seconds=30, finished=finished.set)
    assert report.claimed == 0
    assert finished.is_set()
