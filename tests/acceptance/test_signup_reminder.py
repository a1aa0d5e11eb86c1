"""The sign-up reminder, end to end: "confirm your email", unless the user already did.

A producer enqueues a delayed reminder, keyed ``confirm-reminder:user:<id>`` and guarded by
``http``, when a user signs up. Four worker processes (four ``celery worker`` instances, one
pool process each), beat, a real SMTP sink and the deployment's confirmation service (an HTTP
server on loopback, asked by the ``http`` guard) run for real. Send times are a few seconds
ahead instead of 24 hours; beat ticks every 30 s, so whatever arrives on time was woken by the
workers' wake-up timers, not by beat.
"""

from __future__ import annotations

import functools
import itertools
import json
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, text

import notifier
from notifier.db.producers import ProducerConnection
from tests.acceptance.conftest import REPO, Services, wait_for
from tests.smtp_sink import SmtpSink

WORKERS = ("w1", "w2", "w3", "w4")


def reminder_key(user: int) -> str:
    return f"confirm-reminder:user:{user}"


def address(user: int) -> str:
    return f"user{user}@example.com"


@dataclass
class ConfirmationService:
    """The deployment's own service that knows who confirmed; the ``http`` guard asks it."""

    confirmed: set[int] = field(default_factory=set)
    #: every question, as the dedupe key asked about
    asked: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    def start(self) -> ConfirmationService:
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                question = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                user = int(question["payload"]["user"])
                with service._lock:
                    service.asked.append(question["dedupe_key"])
                    confirmed = user in service.confirmed
                answer = (
                    {"send": False, "reason": f"user {user} confirmed their email"}
                    if confirmed
                    else {"send": True}
                )
                body = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/may-remind"

    def questions(self) -> Counter[str]:
        with self._lock:
            return Counter(self.asked)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


@pytest.fixture
def confirmations(
    engine: Engine, services: Services, smtp_sink: SmtpSink
) -> Iterator[ConfirmationService]:
    """The confirmation service, four workers listening for wake-ups, and beat every 30 s."""
    service = ConfirmationService().start()
    services.env.update(
        NOTIFIER_GUARD_HTTP_URL=service.url,
        NOTIFIER_GUARD_HTTP_TIMEOUT="10",  # a loaded test machine must not cause retries
        NOTIFIER_DISPATCH_INTERVAL="30",
    )
    for name in WORKERS:
        services.worker(name, concurrency=1)
    services.beat()
    wait_for(lambda: _listeners(engine) == len(WORKERS), 60, "every worker to listen for wake-ups")
    _warm_up(engine, services, smtp_sink, service)
    yield service
    service.stop()


def _warm_up(
    engine: Engine, services: Services, sink: SmtpSink, service: ConfirmationService
) -> None:
    """Have every worker send one guarded email, then forget those deliveries and questions.

    A pool process builds its dispatcher, providers and guard client during its first dispatch,
    which takes a good part of a second (more on a busy machine). That cold start is not what
    these tests time: they time the wake-ups of workers already running.
    """

    def dispatched(name: str) -> bool:
        return "batch claimed=" in (services.logs / f"{name}.log").read_text(errors="replace")

    for n in itertools.count():
        if all(dispatched(name) for name in WORKERS):
            break
        assert n < 10, "a worker never took a dispatch while warming up"
        # one due-now row every 100 ms: each wakes a dispatch while the others are still busy
        keys = [f"warm-up:{n}:{i}" for i in range(8)]
        for k in keys:
            with engine.begin() as conn:
                sign_up(conn, 0, datetime.now(UTC), key=k)
            time.sleep(0.1)
        wait_for(functools.partial(_all_sent, engine, keys), 30, f"warm-up round {n}")
    with sink._lock, service._lock:
        sink.messages.clear()
        service.asked.clear()


def _all_sent(engine: Engine, keys: list[str]) -> bool:
    with engine.connect() as conn:
        unsent = conn.execute(
            text(
                "SELECT count(*) FROM notifications"
                " WHERE dedupe_key = ANY(:keys) AND status <> 'sent'"
            ),
            {"keys": keys},
        ).scalar_one()
    return bool(unsent == 0)


def _listeners(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND application_name = 'notifier-wake'"
                )
            ).scalar_one()
        )


def sign_up(
    conn: ProducerConnection, user: int, send_at: datetime, key: str | None = None
) -> notifier.Enqueued:
    """What the producer does when ``user`` signs up: remind them later, unless confirmed."""
    return notifier.enqueue(
        conn,
        channel="email",
        to=address(user),
        subject="Please confirm your email",
        body="Click the link we sent you to finish signing up.",
        payload={"user": user},
        key=key or reminder_key(user),
        send_at=send_at,
        guard="http",
    )


def _rows(engine: Engine, users: list[int]) -> dict[int, tuple[Any, ...]]:
    """user -> (status, attempts, last_error, sent_at - next_attempt_at in seconds)."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT (payload->>'user')::int, status, attempts, last_error,"
                " extract(epoch FROM sent_at - next_attempt_at)::float8"
                " FROM notifications WHERE (payload->>'user')::int = ANY(:users)"
            ),
            {"users": users},
        ).all()
    return {int(r[0]): tuple(r[1:]) for r in rows}


def _finished(engine: Engine, users: list[int]) -> bool:
    rows = _rows(engine, users)
    return len(rows) == len(users) and all(
        r[0] in ("sent", "dead", "cancelled") for r in rows.values()
    )


def _delivered(sink: SmtpSink) -> Counter[str]:
    return Counter(r for m in list(sink.messages) for r in m.rcpt_tos)


def test_confirmed_user_whose_reminder_the_producer_cancels_gets_none(
    engine: Engine,
    services: Services,
    smtp_sink: SmtpSink,
    confirmations: ConfirmationService,
) -> None:
    """(a) The user confirms before the time and the producer cancels: nothing is sent.

    Users 1-5 confirm; the producer cancels each way there is: ``notifier.cancel``, plain SQL,
    and the ``notifier cancel`` command. User 6 never confirms and is reminded, which shows the
    service was delivering all along.
    """
    now = datetime.now(UTC)
    confirming, control = [1, 2, 3, 4, 5], 6
    with engine.begin() as conn:
        for user in confirming:
            sign_up(conn, user, now + timedelta(seconds=6))
        sign_up(conn, control, now + timedelta(seconds=7))

    with engine.begin() as conn:  # each user confirms: the producer cancels in the same breath
        for user in confirming[:3]:
            assert notifier.cancel(conn, reminder_key(user), "user confirmed")
        cancelled_by_sql = conn.execute(
            text(
                "UPDATE notifications SET status = 'cancelled', last_error = 'user confirmed',"
                " updated_at = now() WHERE dedupe_key = :key"
                " AND status IN ('pending', 'processing') RETURNING id"
            ),
            {"key": reminder_key(4)},
        ).all()
    assert len(cancelled_by_sql) == 1
    command = subprocess.run(
        [
            sys.executable,
            "-m",
            "notifier.cli",
            "cancel",
            reminder_key(5),
            "--reason",
            "user confirmed",
        ],
        cwd=REPO,
        env=services.env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (command.returncode, command.stdout.strip()) == (
        0,
        f"cancelled the notification with key {reminder_key(5)!r}",
    ), command.stderr
    assert datetime.now(UTC) < now + timedelta(seconds=6)  # every cancel came before the time

    wait_for(lambda: _delivered(smtp_sink)[address(control)] == 1, 30, "the control reminder")
    wait_for(lambda: _finished(engine, [*confirming, control]), 10, "every row to be finished")

    rows = _rows(engine, [*confirming, control])
    assert {u: rows[u][:3] for u in confirming} == {
        u: ("cancelled", 0, "user confirmed") for u in confirming
    }
    assert rows[control][:2] == ("sent", 1)
    assert set(_delivered(smtp_sink)) == {address(control)}
    assert confirmations.questions() == Counter(
        {reminder_key(control): 1}
    )  # cancelled rows: not asked


def test_confirmed_user_whose_producer_forgot_to_cancel_is_stopped_by_the_guard(
    engine: Engine, smtp_sink: SmtpSink, confirmations: ConfirmationService
) -> None:
    """(b) The producer forgot to cancel; the confirmation service says no: nothing is sent."""
    confirming, control = [11, 12, 13, 14, 15], 16
    confirmations.confirmed.update(confirming)
    send_at = datetime.now(UTC) + timedelta(seconds=3)
    with engine.begin() as conn:
        for user in [*confirming, control]:
            sign_up(conn, user, send_at)

    wait_for(lambda: _finished(engine, [*confirming, control]), 30, "every row to be finished")
    time.sleep(0.5)  # a late, duplicate delivery would show up in the sink by now

    rows = _rows(engine, [*confirming, control])
    assert {u: rows[u][:3] for u in confirming} == {
        u: ("cancelled", 1, f"guard http: user {u} confirmed their email") for u in confirming
    }
    assert rows[control][:3] == ("sent", 1, None)
    assert _delivered(smtp_sink) == Counter({address(control): 1})
    assert confirmations.questions() == Counter(
        {reminder_key(u): 1 for u in [*confirming, control]}
    )


def test_four_replicas_four_workers_one_reminder_each_on_time(
    engine: Engine,
    database_url: str,
    services: Services,
    smtp_sink: SmtpSink,
    confirmations: ConfirmationService,
) -> None:
    """(c) Never confirmed: four producer replicas enqueue every user's reminder, four workers
    deliver; each user gets exactly one, less than a second after its time."""
    users = list(range(101, 151))
    # Due 4 s from now, one user every 100 ms: every delivery needs its own wake-up on time.
    first = datetime.now(UTC) + timedelta(seconds=4)
    send_at = {u: first + timedelta(seconds=0.1 * i) for i, u in enumerate(users)}
    orders = [
        users,
        users[::-1],
        *(random.Random(seed).sample(users, len(users)) for seed in (1, 2)),
    ]
    results: list[list[tuple[int, notifier.Enqueued]]] = [[] for _ in orders]
    errors: list[BaseException] = []
    start = threading.Barrier(len(orders))
    dsn = database_url.replace("postgresql+psycopg://", "postgresql://")

    def replica(n: int) -> None:
        try:
            with psycopg.connect(dsn) as conn:
                start.wait(10)
                for user in orders[n]:
                    with conn.transaction():  # one sign-up request, one transaction
                        results[n].append((user, sign_up(conn, user, send_at[user])))
        except BaseException as exc:
            errors.append(exc)
            raise

    replicas = [threading.Thread(target=replica, args=(n,)) for n in range(len(orders))]
    for t in replicas:
        t.start()
    for t in replicas:
        t.join(30)
    assert errors == []
    assert datetime.now(UTC) < first  # every insert was in before the first reminder was due

    created = Counter(user for done in results for user, r in done if r.created)
    assert created == Counter({u: 1 for u in users})  # exactly one replica wrote each row
    ids = {user: {r.id for done in results for u, r in done if u == user} for user in users}
    assert all(len(i) == 1 for i in ids.values())  # and every replica was told its id

    wait_for(lambda: _finished(engine, users), 40, "every reminder to be finished")
    time.sleep(1.0)  # a late, duplicate delivery would show up in the sink by now

    with engine.connect() as conn:
        per_key = conn.execute(
            text(
                "SELECT dedupe_key, count(*) FROM notifications"
                " WHERE dedupe_key LIKE 'confirm-reminder:%' GROUP BY 1"
            )
        ).all()
    assert dict(per_key) == {reminder_key(u): 1 for u in users}
    assert _delivered(smtp_sink) == Counter({address(u): 1 for u in users})
    assert confirmations.questions() == Counter({reminder_key(u): 1 for u in users})
    rows = _rows(engine, users)
    assert {r[:3] for r in rows.values()} == {("sent", 1, None)}
    late = {u: r[3] for u, r in rows.items()}
    assert min(late.values()) >= 0  # none sent early
    assert max(late.values()) < 1.0, sorted(late.items(), key=lambda kv: -kv[1])[:5]
    # beat (every 30 s) fired no dispatch: the wake-up timers delivered every reminder
    beat = (services.logs / "beat.log").read_text()
    assert "beat: Starting" in beat
    assert "notifier.dispatch" not in beat
