"""Sends on the worker's event loop, through the real dispatcher and a real PostgreSQL.

Webhook rows without a guard are sent as coroutines (``notifier.delivery.sender.Sender``). The
receivers are real servers on loopback: ``Receiver`` (threaded HTTP/1.1 keep-alive, records when
each request arrived and was answered) and ``RawServer`` for the faults. ``Forgetful`` is a provider
plugin that forgets its timeouts, against a real server that never answers: the dispatcher has to
end its sends by itself.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import itertools
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest
from sqlalchemy import Engine, text

from notifier.delivery.batch import BatchReport
from notifier.delivery.dispatcher import Dispatcher
from notifier.models import Notification
from notifier.providers import Outcome, Provider, Registry, Sent, load_registry, registry_of
from notifier.settings import Settings, get_settings
from tests.factories import MakeRows, SetEnv
from tests.raw_server import Behaviour, RawServer, read_request, silence
from tests.receiver import Receiver

LOOPBACK = "127.0.0.0/8,::1/128"
SECRET = "whsec_" + base64.b64encode(b"an async webhook signing key 32b").decode()
#: Timeouts small enough that ``longest_send_seconds`` is 0.6 s.
QUICK = {
    "smtp_timeout": 0.1,
    "sms_timeout": 0.1,
    "push_timeout": 0.1,
    "esp_timeout": 0.1,
    "ses_timeout": 0.1,
    "webhook_timeout": 0.2,
}

Webhooks = Callable[..., None]

#: How long a batch may start sends: long enough that claiming and preparing its one row fits
#: on a loaded machine (0.2 s once did not, and the row was handed back unsent).
SEND_WINDOW = 1.0


@pytest.fixture
def webhooks(set_env: SetEnv) -> Webhooks:
    """Configures the webhook provider through the environment, as a worker is configured."""

    def configure(*, allowed: str = LOOPBACK, timeout: float = 5, at_once: int = 100) -> None:
        # The provider keeps a connection for each send that may run at once.
        set_env(
            async_send_concurrency=at_once,
            webhook_allow_http=True,
            webhook_allowed_networks=allowed,
            webhook_timeout=timeout,
            webhook_secret=SECRET,
        )

    configure()
    return configure


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


def _rows(engine: Engine) -> dict[int, tuple[Any, ...]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT id, status, attempts, last_error FROM notifications ORDER BY id")
        ).all()
    return {int(r[0]): tuple(r[1:]) for r in rows}


MakeDispatcher = Callable[..., Dispatcher]


@pytest.fixture
def make_dispatcher(engine: Engine, settings: Settings) -> Iterator[MakeDispatcher]:
    """The real dispatcher, with every registered provider unless told; closed after the test."""
    made: list[Dispatcher] = []

    def make(registry: Registry | None = None, **update: Any) -> Dispatcher:
        stopping = update.pop("stopping", None)
        made.append(
            Dispatcher(
                engine,
                load_registry(get_settings()) if registry is None else registry,
                settings.model_copy(update=update),
                stopping=stopping,
            )
        )
        return made[-1]

    yield make
    for dispatcher in made:
        dispatcher.close()


def _timed(dispatcher: Dispatcher, deadline: float | None = None) -> tuple[BatchReport, float]:
    started = time.monotonic()
    report = dispatcher.run_once(deadline)
    return report, time.monotonic() - started


# -- many at once ---------------------------------------------------------------------------------


def test_many_sends_overlap_and_each_is_signed(
    engine: Engine,
    make_rows: MakeRows,
    make_dispatcher: MakeDispatcher,
    receiver: Receiver,
    webhooks: Webhooks,
) -> None:
    """200 sends to a receiver that answers after 50 ms: one at a time would take 10 s."""
    webhooks(at_once=200)
    receiver.delay = 0.05
    ids = make_rows(200, channel="webhook", recipient=receiver.url, subject=lambda i: f"n{i}")
    dispatcher = make_dispatcher(batch_size=200, send_concurrency=1, async_send_concurrency=200)
    report, took = _timed(dispatcher)

    assert report.sent == 200
    assert took < 3.0  # one thread would need 10 s
    # Many at the receiver at once (it runs in this process too, so not quite all 200, and on a
    # busy machine far fewer: one at a time is what this rules out).
    assert receiver.most_at_once() >= 20
    assert receiver.counts() == {f"notification-{i}": 1 for i in ids}
    key = base64.b64decode(SECRET.removeprefix("whsec_"))
    for headers, body in receiver.requests:
        signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
        digest = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        assert headers["webhook-signature"] == f"v1,{digest}"


@pytest.mark.usefixtures("webhooks")
def test_connections_are_kept_alive_across_batches(
    engine: Engine, make_rows: MakeRows, make_dispatcher: MakeDispatcher, receiver: Receiver
) -> None:
    receiver.delay = 0.05
    make_rows(100, channel="webhook", recipient=receiver.url, subject=lambda i: f"n{i}")
    dispatcher = make_dispatcher(batch_size=50, async_send_concurrency=50)
    first = dispatcher.run_once()
    opened = receiver.connections
    second = dispatcher.run_once()

    assert first.sent == second.sent == 50
    assert 0 < opened <= 50  # one per send at once, at most
    assert receiver.connections == opened  # the second batch opened none


@pytest.mark.usefixtures("webhooks")
def test_close_hangs_up_the_kept_alive_connections(
    engine: Engine,
    make_rows: MakeRows,
    make_dispatcher: MakeDispatcher,
    raw_server: Callable[[Behaviour], RawServer],
) -> None:
    hung_up = threading.Event()

    def keep_alive(conn: socket.socket, _: threading.Event) -> None:
        while read_request(conn) is not None:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        hung_up.set()

    server = raw_server(keep_alive)
    make_rows(1, channel="webhook", recipient=server.url + "/hook", subject="n1")
    dispatcher = make_dispatcher()
    assert dispatcher.run_once().sent == 1
    assert not hung_up.wait(0.3)  # kept for the next batch
    dispatcher.close()
    assert hung_up.wait(2)


# -- failures -------------------------------------------------------------------------------------


@pytest.mark.usefixtures("webhooks")
def test_server_errors_are_retried(
    engine: Engine, make_rows: MakeRows, make_dispatcher: MakeDispatcher, receiver: Receiver
) -> None:
    receiver.status = 503
    ids = make_rows(3, channel="webhook", recipient=receiver.url, subject=lambda i: f"n{i}")
    assert make_dispatcher().run_once().retried == 3
    rows = _rows(engine).values()
    assert {r[:2] for r in rows} == {("pending", 1)}
    assert all(r[2].startswith("HTTP 503 from 127.0.0.1:") for r in rows)
    assert len(receiver.requests) == len(ids)


def test_a_silent_server_is_bounded_by_the_read_timeout(
    engine: Engine,
    make_rows: MakeRows,
    make_dispatcher: MakeDispatcher,
    raw_server: Callable[[Behaviour], RawServer],
    webhooks: Webhooks,
) -> None:
    webhooks(timeout=0.5)
    server = raw_server(silence)
    make_rows(1, channel="webhook", recipient=server.url + "/hook", subject="n1")
    report, took = _timed(make_dispatcher())

    assert server.accepted == 1  # the fault happened: it took the request and said nothing
    assert report.retried == 1
    [(status, attempts, error)] = _rows(engine).values()
    assert (status, attempts) == ("pending", 1)
    assert error.startswith("timed out (ReadTimeout) after the 0.5s limit POSTing to 127.0.0.1:")
    assert 0.45 <= took < 2.5


def test_a_dripping_server_is_bounded_by_the_whole_send_timeout(
    engine: Engine,
    make_rows: MakeRows,
    make_dispatcher: MakeDispatcher,
    raw_server: Callable[[Behaviour], RawServer],
    webhooks: Webhooks,
) -> None:
    """A byte every 0.1 s resets any read timeout; the send's total (3 x 0.5 s) ends it."""
    hung_up = threading.Event()

    def drip(conn: socket.socket, stopping: threading.Event) -> None:
        read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        try:
            while not stopping.wait(0.1):
                conn.sendall(b"X")  # a header line that never ends
        except OSError:
            hung_up.set()

    webhooks(timeout=0.5)
    server = raw_server(drip)
    make_rows(1, channel="webhook", recipient=server.url + "/hook", subject="n1")
    report, took = _timed(make_dispatcher())

    assert report.retried == 1
    [(status, attempts, error)] = _rows(engine).values()
    assert (status, attempts) == ("pending", 1)
    assert error.startswith("timed out (the whole send) after its 1.5s limit POSTing to")
    assert 1.4 <= took < 3.5
    assert hung_up.wait(2)  # the connection was closed, not left dripping


def test_internal_targets_are_refused_by_name_unless_allowed(
    engine: Engine,
    make_rows: MakeRows,
    make_dispatcher: MakeDispatcher,
    receiver: Receiver,
    webhooks: Webhooks,
) -> None:
    """``localhost`` resolves to loopback: refused without a connection, sent once allowed."""
    webhooks(allowed="")
    by_name = receiver.url.replace("127.0.0.1", "localhost")
    [refused] = make_rows(1, channel="webhook", recipient=by_name, subject="n1")
    assert make_dispatcher().run_once().dead == 1
    status, attempts, error = _rows(engine)[refused]
    assert (status, attempts) == ("dead", 1)
    assert "webhook target localhost resolves to " in error
    assert error.endswith("allow that network with NOTIFIER_WEBHOOK_ALLOWED_NETWORKS")
    assert receiver.connections == 0

    webhooks(allowed=LOOPBACK)
    [allowed] = make_rows(1, channel="webhook", recipient=by_name, subject="n1")
    assert make_dispatcher().run_once().sent == 1
    assert receiver.counts() == {f"notification-{allowed}": 1}


# -- stopping, the deadline, and sends that never end ---------------------------------------------


@pytest.mark.usefixtures("webhooks")
@pytest.mark.parametrize("how", ["stopping", "deadline"])
def test_sends_under_way_finish_and_unstarted_rows_are_handed_back(
    engine: Engine,
    make_rows: MakeRows,
    make_dispatcher: MakeDispatcher,
    receiver: Receiver,
    how: str,
) -> None:
    receiver.delay = 1.5
    ids = make_rows(10, channel="webhook", recipient=receiver.url, subject=lambda i: f"n{i}")
    stopping = threading.Event()
    dispatcher = make_dispatcher(async_send_concurrency=2, stopping=stopping)
    reports: list[BatchReport] = []
    if how == "deadline":
        reports.append(dispatcher.run_once(deadline=time.monotonic() + 1.0))
    else:
        running = threading.Thread(target=lambda: reports.append(dispatcher.run_once()))
        running.start()
        deadline = time.monotonic() + 10
        while receiver.arrived() < 2:
            assert time.monotonic() < deadline, "the first two sends never arrived"
            time.sleep(0.01)
        stopping.set()
        running.join(10)

    [report] = reports
    assert (report.claimed, report.sent, report.released) == (10, 2, 8)
    rows = _rows(engine)
    assert sorted(rows[i][:2] for i in ids) == [("pending", 0)] * 8 + [("sent", 1)] * 2
    assert len(receiver.deliveries) == 2  # the two under way were finished, not cut


class Forgetful(Provider):
    """A provider plugin that forgets its timeouts: it waits for its server's answer for ever."""

    channel: ClassVar[str] = "forgetful"

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.address = (host, int(port))

    def validate(self, notification: Notification) -> None:
        return None

    def send(self, notification: Notification) -> Outcome:
        with socket.create_connection(self.address) as conn:
            conn.sendall(_request())
            conn.recv(1)  # no timeout
        return Sent()

    def close(self) -> None:
        return None


class ForgetfulAsync(Forgetful):
    async def send_async(self, notification: Notification) -> Outcome:
        reader, writer = await asyncio.open_connection(*self.address)
        try:
            writer.write(_request())
            await writer.drain()
            await reader.read(1)  # no timeout
        finally:
            writer.close()
        return Sent()


def _request() -> bytes:
    return b"POST /hook HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"


def test_an_endless_send_on_the_loop_is_abandoned_and_cancelled_for_real(
    engine: Engine,
    make_rows: MakeRows,
    make_dispatcher: MakeDispatcher,
    raw_server: Callable[[Behaviour], RawServer],
) -> None:
    hung_up = threading.Event()

    def wait_for_hang_up(conn: socket.socket, stopping: threading.Event) -> None:
        read_request(conn)
        while not stopping.is_set():
            try:
                if conn.recv(1) == b"":
                    hung_up.set()
                    return
            except TimeoutError:
                continue

    server = raw_server(wait_for_hang_up)
    make_rows(1, channel="forgetful", recipient="x", subject="n1")
    dispatcher = make_dispatcher(registry_of([ForgetfulAsync(server.url)]), **QUICK)
    assert dispatcher.settings.longest_send_seconds == pytest.approx(0.6)
    report, took = _timed(dispatcher, deadline=time.monotonic() + SEND_WINDOW)

    assert report.retried == 1
    [(status, attempts, error)] = _rows(engine).values()
    assert (status, attempts, error) == ("pending", 1, "send still running after 1s; abandoned")
    # the deadline plus longest_send_seconds (0.6 s), and no more than a slow machine's margin
    assert SEND_WINDOW + 0.55 <= took < SEND_WINDOW + 0.6 + 3
    assert hung_up.wait(2)  # cancelled, not left running: its connection was closed


def test_an_endless_send_in_a_thread_is_abandoned_after_the_deadline(
    engine: Engine,
    make_rows: MakeRows,
    make_dispatcher: MakeDispatcher,
    raw_server: Callable[[Behaviour], RawServer],
) -> None:
    server = raw_server(silence)
    make_rows(1, channel="forgetful", recipient="x", subject="n1")
    dispatcher = make_dispatcher(registry_of([Forgetful(server.url)]), **QUICK)
    report, took = _timed(dispatcher, deadline=time.monotonic() + SEND_WINDOW)

    assert server.accepted == 1
    assert report.retried == 1
    [(status, attempts, error)] = _rows(engine).values()
    assert (status, attempts, error) == ("pending", 1, "send still running after 1s; abandoned")
    # the deadline plus longest_send_seconds (0.6 s), and no more than a slow machine's margin
    assert SEND_WINDOW + 0.55 <= took < SEND_WINDOW + 0.6 + 3


def test_sent_at_is_when_each_send_ended_not_when_the_batch_was_recorded(
    engine: Engine,
    make_rows: MakeRows,
    make_dispatcher: MakeDispatcher,
    receiver: Receiver,
    webhooks: Webhooks,
) -> None:
    """One send at a time to a receiver that takes 0.3 s: the rows' ``sent_at`` are 0.3 s
    apart, and the first is well before the batch was written."""
    webhooks(at_once=1)
    receiver.delay = 0.3
    make_rows(3, channel="webhook", recipient=receiver.url, subject=lambda i: f"n{i}")
    report = make_dispatcher(async_send_concurrency=1).run_once()
    assert report.sent == 3
    with engine.connect() as conn:
        stamps = conn.execute(
            text("SELECT sent_at, updated_at FROM notifications ORDER BY sent_at")
        ).all()
    gaps = [(b.sent_at - a.sent_at).total_seconds() for a, b in itertools.pairwise(stamps)]
    assert all(0.25 <= gap < 1.0 for gap in gaps), gaps
    assert (stamps[-1].updated_at - stamps[0].sent_at).total_seconds() >= 0.5
    assert all(row.sent_at <= row.updated_at for row in stamps)
