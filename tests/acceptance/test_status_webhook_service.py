"""A producer's status webhook receiver that hangs, against a real worker of one process.

``--concurrency=1`` is what Celery picks on a one-CPU host: every dispatch, and every run of
the status webhook, takes turns on that one process. The receiver accepts each connection,
reads the request and never answers, so each POST lasts its whole ``NOTIFIER_WEBHOOK_TIMEOUT``
(10 s, the default); rows keep arriving meanwhile, as they do in production.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable

import pytest
from sqlalchemy import Engine, text

from tests.acceptance.conftest import Services, wait_for
from tests.raw_server import RawServer, read_request
from tests.smtp_sink import SmtpSink

pytestmark = pytest.mark.slow

ROWS = 40
#: Seconds between two inserts: the rows arrive over about 20 s, while POSTs hang.
INSERT_EVERY = 0.5
#: Seconds every row may wait from its insert until it is sent. Beat fires a dispatch every
#: second here and an insert wakes one at once, and a status webhook run keeps the process for
#: about a second at most: a row waits 2-3 s on a busy machine. On the code before the run was
#: bounded, a row waited behind each run's 10 s POST (7 of 40 sent in 65 s): 15 s sits far
#: from both, and a machine five times slower than expected still passes.
MOST_WAIT_SECONDS = 15.0


def _hang(conn: socket.socket, stopping: threading.Event) -> None:
    """Read the request and never answer, until the test ends; in a thread of its own, so
    the server goes on accepting the next connections."""
    held = conn.dup()

    def hold() -> None:
        with held, contextlib.suppress(OSError):
            read_request(held)
            stopping.wait(120)

    threading.Thread(target=hold, daemon=True).start()


def _insert(engine: Engine, i: int) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO notifications (channel, recipient, subject, body)"
                " VALUES ('email', :to, 'hello', 'body')"
            ),
            {"to": f"user{i}@example.com"},
        )


def _sent(engine: Engine) -> int:
    with engine.connect() as conn:
        found = conn.execute(
            text("SELECT count(*) FROM notifications WHERE status = 'sent'")
        ).scalar_one()
    return int(found)


@pytest.mark.timeout(180)
def test_a_hanging_status_receiver_does_not_hold_back_dispatch(
    engine: Engine,
    smtp_sink: SmtpSink,
    services: Services,
    raw_server: Callable[[Callable[[socket.socket, threading.Event], None]], RawServer],
) -> None:
    hanging = raw_server(_hang)
    services.env["NOTIFIER_STATUS_WEBHOOK_URL"] = f"{hanging.url}/status"
    services.worker(concurrency=1)
    services.beat()

    _insert(engine, 0)
    wait_for(lambda: _sent(engine) == 1, 30, "the first row to be sent")
    # The fault: its event's POST is made and hangs (the receiver holds the connection).
    wait_for(lambda: hanging.accepted >= 1, 30, "the status webhook to POST to the receiver")
    for i in range(1, ROWS):
        _insert(engine, i)
        time.sleep(INSERT_EVERY)
    deadline = time.monotonic() + MOST_WAIT_SECONDS
    while time.monotonic() < deadline and _sent(engine) < ROWS:
        time.sleep(0.2)

    with engine.connect() as conn:
        sent, most_wait = conn.execute(
            text(
                "SELECT count(*) FILTER (WHERE status = 'sent'),"
                " max(extract(epoch FROM coalesce(sent_at, now()) - created_at))::float8"
                " FROM notifications"
            )
        ).one()
        events = conn.execute(text("SELECT count(*) FROM status_events")).scalar_one()
    print(f"sent {sent} of {ROWS}; the longest wait {most_wait:.1f}s; {events} events")
    assert sent == ROWS
    assert most_wait < MOST_WAIT_SECONDS
    assert events >= ROWS  # each sent row made its event, which went to the hanging receiver
    assert hanging.accepted >= 2  # the status webhook kept POSTing meanwhile
