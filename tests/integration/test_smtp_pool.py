"""The email provider on the event loop: its pool of SMTP connections, PIPELINING, TLS and AUTH,
and what it does when a relay refuses or hangs, against real SMTP servers on loopback.

``tests.smtp_relay.SmtpRelay`` records each command with the answers sent before it arrived,
so pipelining is read from what the server saw; aiosmtpd serves STARTTLS, implicit TLS and
AUTH with a certificate made here (``cryptography``), trusted through ``SSL_CERT_FILE``.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from sqlalchemy import Engine, text

from notifier import eventloop
from notifier.delivery.dispatcher import Dispatcher
from notifier.models import Notification
from notifier.providers import Outcome, load_registry
from notifier.providers.base import Retry, Sent
from notifier.providers.email import THROTTLE_SECONDS, EmailProvider
from notifier.settings import Settings, get_settings
from tests.certificates import self_signed
from tests.factories import MakeRows, SetEnv
from tests.integration.test_email_provider import note
from tests.smtp_relay import SmtpRelay
from tests.smtp_sink import SmtpSink

ADA = "ada@example.com"
FROM = "Shop <noreply@shop.example>"


def sent(*ids: int) -> list[Outcome]:
    return [Sent(f"<notification-{i}@shop.example>") for i in ids]


MakeRelay = Callable[..., SmtpRelay]
MakeProvider = Callable[..., EmailProvider]


@pytest.fixture
def relay() -> Iterator[MakeRelay]:
    started: list[SmtpRelay] = []

    def start(**behaviour: Any) -> SmtpRelay:
        started.append(SmtpRelay(**behaviour).start())
        return started[-1]

    yield start
    for r in started:
        r.stop()


@pytest.fixture
def provider(set_env: SetEnv) -> Iterator[MakeProvider]:
    """``provider(port, smtp_timeout=1, ...)``: an EmailProvider for the server on ``port``,
    shut down (its pool closed) after the test."""
    made: list[EmailProvider] = []

    def make(port: int, **env: Any) -> EmailProvider:
        set_env(smtp_host="127.0.0.1", smtp_port=port, email_from=FROM, **env)
        made.append(EmailProvider(get_settings()))
        return made[-1]

    yield make
    for p in made:
        p.shutdown()


def at_once(provider: EmailProvider, notes: list[Notification]) -> list[Outcome]:
    """Every send started at once on the process's event loop, as the dispatcher starts them."""

    async def all_of() -> list[Outcome]:
        return list(await asyncio.gather(*(provider.send_async(n) for n in notes)))

    return eventloop.run(all_of())


def groups(log: list[tuple[str, int]]) -> list[list[tuple[str, int]]]:
    """The MAIL, RCPT, DATA of each transaction in a session's log."""
    verbs = [verb for verb, _ in log]
    starts = [i for i, verb in enumerate(verbs) if verb == "MAIL"]
    return [log[i : i + 3] for i in starts]


# -- pipelining ------------------------------------------------------------------------------------


def test_the_envelope_is_pipelined_when_the_relay_offers_it(
    relay: MakeRelay, provider: MakeProvider
) -> None:
    # The relay holds its answers to MAIL and RCPT until DATA arrives: a client waiting for
    # each answer would time out.
    r = relay(hold_envelope=True)
    p = provider(r.port, smtp_timeout=5)

    assert [p.send(note(id=i)) for i in (1, 2, 3)] == sent(1, 2, 3)

    assert len(r.messages) == 3
    [log] = r.sessions
    for group in groups(log):
        assert [verb for verb, _ in group] == ["MAIL", "RCPT", "DATA"]
        assert len({answered for _, answered in group}) == 1  # all three before any answer


def test_each_answer_is_awaited_when_pipelining_is_not_offered(
    relay: MakeRelay, provider: MakeProvider
) -> None:
    r = relay(pipelining=False)
    p = provider(r.port)

    assert [p.send(note(id=i)) for i in (1, 2)] == sent(1, 2)

    [log] = r.sessions
    assert len(groups(log)) == 2
    for group in groups(log):
        answered = [n for _, n in group]
        assert answered == [answered[0], answered[0] + 1, answered[0] + 2]


def test_a_server_without_ehlo_is_greeted_with_helo(
    relay: MakeRelay, provider: MakeProvider
) -> None:
    r = relay(ehlo=False)
    p = provider(r.port)

    assert p.send(note(id=1)) == sent(1)[0]

    assert r.verbs(0)[:2] == ["EHLO", "HELO"]
    assert r.verbs(0)[2:5] == ["MAIL", "RCPT", "DATA"]
    [group] = groups(r.sessions[0])
    answered = [n for _, n in group]
    assert answered == [answered[0], answered[0] + 1, answered[0] + 2]  # no PIPELINING


# -- the pool --------------------------------------------------------------------------------------


def test_connections_are_reused_across_batches_and_closed_by_shutdown(
    relay: MakeRelay, provider: MakeProvider
) -> None:
    r = relay()
    p = provider(r.port)

    assert at_once(p, [note(id=1)]) == sent(1)
    p.close()  # the end of a batch
    assert at_once(p, [note(id=2)]) == sent(2)
    p.close()
    assert r.connections == 1

    p.shutdown()
    assert r.verbs(0)[-1] == "QUIT"
    assert at_once(p, [note(id=3)]) == sent(3)
    assert r.connections == 2


def test_a_connection_is_renewed_after_its_messages(
    relay: MakeRelay, provider: MakeProvider
) -> None:
    r = relay()
    p = provider(r.port, smtp_messages_per_connection=3)

    assert [p.send(note(id=i)) for i in range(1, 8)] == sent(*range(1, 8))

    assert r.connections == 3
    for session in (0, 1):
        verbs = r.verbs(session)
        assert verbs.count("DATA") == 3
        assert verbs[-1] == "QUIT"
    assert r.verbs(2).count("DATA") == 1


def test_sends_at_once_never_open_more_connections_than_the_limit(
    relay: MakeRelay, provider: MakeProvider
) -> None:
    r = relay(limit=4)  # refuses a fifth connection
    p = provider(r.port, smtp_max_connections=4)

    assert at_once(p, [note(id=i) for i in range(1, 41)]) == sent(*range(1, 41))

    assert r.connections == 4  # 40 sends at once used all four...
    assert r.peak == 4  # ...never more at once
    assert r.refused == 0
    assert len(r.messages) == 40


def test_a_relay_refusing_connections_shrinks_the_pool_and_defers(
    relay: MakeRelay, provider: MakeProvider
) -> None:
    r = relay(limit=2)
    p = provider(r.port, smtp_max_connections=8)

    outcomes = at_once(p, [note(id=i) for i in range(1, 17)])

    assert r.refused > 0  # the fault happened: connections past two were answered 421
    throttled = Retry(
        "", retry_after=THROTTLE_SECONDS, throttled=True, scope=f"smtp:127.0.0.1:{r.port}"
    )
    refused = [o for o in outcomes if isinstance(o, Retry)]
    assert refused
    for outcome in refused:
        assert "too many connections" in outcome.error
        assert outcome == Retry(outcome.error, **_fields(throttled))
    assert all(isinstance(o, Sent | Retry) for o in outcomes)
    assert len(r.messages) == 16 - len(refused)
    pool = p._pool  # what the relay refusing us did to the pool
    assert pool is not None
    assert pool.limit.now(time.monotonic()) < 8  # halved; it grows back one every 2 s


def _fields(retry: Retry) -> dict[str, Any]:
    return {"retry_after": retry.retry_after, "throttled": retry.throttled, "scope": retry.scope}


def test_a_421_defers_the_row_without_using_an_attempt(
    relay: MakeRelay,
    set_env: SetEnv,
    engine: Engine,
    make_rows: MakeRows,
    settings: Settings,
) -> None:
    r = relay(mail_reply="421 4.7.0 too busy, try later")
    set_env(smtp_host="127.0.0.1", smtp_port=r.port, email_from=FROM)
    [row] = make_rows(1, channel="email", recipient=ADA)
    dispatcher = Dispatcher(engine, load_registry(get_settings()), settings)
    try:
        report = dispatcher.run_once(None)
        pool = dispatcher.registry["email"]._pool  # type: ignore[attr-defined]
        # halved, and back by one every RECOVER_SECONDS: still short of the full pool
        assert pool.limit.now(time.monotonic()) < settings.smtp_max_connections
    finally:
        dispatcher.close()

    assert r.verbs(0)[-1] == "MAIL"  # the relay was asked, and answered 421
    assert report.released == 1
    with engine.connect() as conn:
        status, attempts, deferrals, error = conn.execute(
            text("SELECT status, attempts, deferrals, last_error FROM notifications WHERE id = :i"),
            {"i": row},
        ).one()
    assert (status, attempts, deferrals) == ("pending", 0, 1)
    assert "421 4.7.0 too busy" in error


# -- timeouts --------------------------------------------------------------------------------------


def test_a_relay_that_hangs_mid_reply_is_retried_within_the_timeout(
    relay: MakeRelay, provider: MakeProvider
) -> None:
    r = relay(hang_at="MAIL")
    p = provider(r.port, smtp_timeout=0.5)
    started = time.monotonic()

    outcome = p.send(note())

    # It started its answer to MAIL and never ended it (RCPT and DATA came pipelined).
    assert r.verbs(0)[-3:] == ["MAIL", "RCPT", "DATA"]
    assert r.messages == []
    assert outcome == Retry(f"SMTP timeout after 0.5s talking to 127.0.0.1:{r.port}")
    assert time.monotonic() - started < p.settings.longest_send_seconds


def test_waiting_for_a_connection_counts_towards_the_whole_send(
    relay: MakeRelay, provider: MakeProvider
) -> None:
    # One connection, each message answered after 0.4 s: twelve sends at once take 4.8 s one
    # after the other, past the 3 s a whole send may take.
    r = relay(delay=0.4)
    p = provider(
        r.port,
        smtp_max_connections=1,
        smtp_timeout=0.5,
        webhook_timeout=0.1,
        sms_timeout=0.1,
        push_timeout=0.1,
        esp_timeout=0.1,
        ses_timeout=0.1,
    )
    assert p.settings.longest_send_seconds == 3.0
    started = time.monotonic()

    outcomes = at_once(p, [note(id=i) for i in range(1, 13)])

    assert time.monotonic() - started < 3.0 + 5  # the sends ended by themselves
    assert outcomes[0] == sent(1)[0]
    late = Retry(f"SMTP send to 127.0.0.1:{r.port} took more than 3s in all")
    assert outcomes[-1] == late
    assert set(outcomes) <= {*sent(*range(1, 13)), late}
    assert r.connections == 1


# -- TLS and AUTH ----------------------------------------------------------------------------------


@pytest.fixture
def certificate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ssl.SSLContext:
    """A server context with a fresh self-signed certificate for 127.0.0.1, which the client
    trusts (``SSL_CERT_FILE``, read by ``ssl.create_default_context``)."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert_file, key_file = tmp_path / "relay.pem", tmp_path / "relay.key"
    cert_file.write_bytes(self_signed(key, "notifier test relay", ip="127.0.0.1"))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    monkeypatch.setenv("SSL_CERT_FILE", str(cert_file))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    return context


def _authenticator(
    server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any
) -> AuthResult:
    ok = isinstance(auth_data, LoginPassword) and (auth_data.login, auth_data.password) == (
        b"shop",
        b"s3cret",
    )
    return AuthResult(success=ok, handled=False)


@pytest.fixture
def tls_sink(certificate: ssl.SSLContext) -> Iterator[Callable[..., SmtpSink]]:
    """``tls_sink(implicit=False)``: an aiosmtpd sink requiring STARTTLS (or speaking TLS from
    the first byte) and AUTH after it."""
    controllers: list[Controller] = []

    def start(*, implicit: bool = False) -> SmtpSink:
        sink = SmtpSink()
        sink.start()  # finds a free port
        sink.stop()
        tls: dict[str, Any] = (
            {"ssl_context": certificate}
            if implicit
            else {"tls_context": certificate, "require_starttls": True}
        )
        controller = Controller(
            sink,
            hostname=sink.host,
            port=sink.port,
            authenticator=_authenticator,
            # aiosmtpd counts only STARTTLS as TLS; from the first byte, it is TLS all along
            auth_require_tls=not implicit,
            **tls,
        )
        controller.start()
        controllers.append(controller)
        return sink

    yield start
    for controller in controllers:
        controller.stop()


@pytest.mark.parametrize("tls", ["starttls", "ssl"])
def test_tls_and_login(tls_sink: Callable[..., SmtpSink], provider: MakeProvider, tls: str) -> None:
    sink = tls_sink(implicit=tls == "ssl")
    p = provider(sink.port, smtp_tls=tls, smtp_username="shop", smtp_password="s3cret")

    assert at_once(p, [note(id=1), note(id=2)]) == sent(1, 2)

    assert sorted(m.message_id for m in sink.messages) == [
        "<notification-1@shop.example>",
        "<notification-2@shop.example>",
    ]


def test_a_refused_login_is_retried_naming_the_settings(
    tls_sink: Callable[..., SmtpSink], provider: MakeProvider
) -> None:
    sink = tls_sink()
    p = provider(sink.port, smtp_tls="starttls", smtp_username="shop", smtp_password="wrong")

    outcome = p.send(note())

    assert isinstance(outcome, Retry)
    assert not outcome.throttled
    assert outcome.error.startswith(f"SMTP login as 'shop' refused by 127.0.0.1:{sink.port}: 535")
    assert "NOTIFIER_SMTP_PASSWORD" in outcome.error
    assert sink.messages == []


def test_an_untrusted_certificate_is_refused(
    tls_sink: Callable[..., SmtpSink], provider: MakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = tls_sink()
    monkeypatch.delenv("SSL_CERT_FILE")
    p = provider(sink.port, smtp_tls="starttls", smtp_username="shop", smtp_password="s3cret")

    outcome = p.send(note())

    assert isinstance(outcome, Retry)
    assert "TLS with SMTP server" in outcome.error
    assert "CERTIFICATE_VERIFY_FAILED" in outcome.error
    assert sink.messages == []
