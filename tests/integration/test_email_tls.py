"""The email provider's TLS against real TLS servers (STARTTLS and implicit TLS): the server's
certificate and host name are verified, against ``NOTIFIER_SMTP_CA_FILE`` when it is set and
against the system's CAs when not."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from notifier.providers.base import Retry, Sent
from notifier.providers.email import EmailProvider
from notifier.settings import get_settings
from tests.certificates import ServerCertificate, server_certificate
from tests.factories import SetEnv
from tests.integration.test_email_provider import note
from tests.smtp_sink import SmtpSink


def _server_context(certificate: ServerCertificate) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certificate.cert, certificate.key)
    return context


def _start(mode: str, certificate: ServerCertificate, set_env: SetEnv) -> SmtpSink:
    context = _server_context(certificate)
    sink = SmtpSink(starttls=context) if mode == "starttls" else SmtpSink(implicit_tls=context)
    sink.start()
    set_env(
        smtp_host=sink.host, smtp_port=sink.port, smtp_tls=mode, smtp_timeout=10,
        email_from="noreply@shop.example",
    )  # fmt: skip
    return sink


@pytest.fixture(params=["starttls", "ssl"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def certificate(tmp_path: Path) -> ServerCertificate:
    return server_certificate(tmp_path, "127.0.0.1")


@pytest.fixture
def tls_sink(mode: str, certificate: ServerCertificate, set_env: SetEnv) -> Iterator[SmtpSink]:
    """A sink whose certificate, for 127.0.0.1, the test's own CA issued."""
    sink = _start(mode, certificate, set_env)
    yield sink
    sink.stop()


def _send(note_id: int = 1) -> object:
    provider = EmailProvider(get_settings())
    try:
        return provider.send(note(id=note_id))
    finally:
        provider.close()


def test_a_server_certified_by_the_ca_file_is_trusted(
    tls_sink: SmtpSink, certificate: ServerCertificate, set_env: SetEnv, mode: str
) -> None:
    set_env(smtp_ca_file=str(certificate.ca))

    assert _send() == Sent("<notification-1@shop.example>")
    assert [m.rcpt_tos for m in tls_sink.messages] == [["ada@example.com"]]
    if mode == "starttls":  # the sink records the upgrade; implicit TLS has no plain phase
        assert [s.ssl is not None for s in tls_sink.sessions] == [True]


def test_without_the_ca_file_the_same_server_is_refused(tls_sink: SmtpSink) -> None:
    outcome = _send()

    assert isinstance(outcome, Retry)
    assert "CERTIFICATE_VERIFY_FAILED" in outcome.error
    assert f"127.0.0.1:{tls_sink.port}" in outcome.error
    assert tls_sink.messages == []


def test_the_ca_file_does_not_excuse_another_host_name(
    tmp_path: Path, set_env: SetEnv, mode: str
) -> None:
    elsewhere = server_certificate(tmp_path, "relay.example.test")
    sink = _start(mode, elsewhere, set_env)
    set_env(smtp_ca_file=str(elsewhere.ca))
    try:
        outcome = _send()
    finally:
        sink.stop()

    assert isinstance(outcome, Retry)
    assert "CERTIFICATE_VERIFY_FAILED" in outcome.error
    assert "mismatch" in outcome.error
    assert sink.messages == []


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(None, "No such file", id="missing"),
        pytest.param(b"not a certificate\n", "no certificate", id="not-pem"),
    ],
)
def test_an_unusable_ca_file_stops_the_provider_naming_the_setting(
    tmp_path: Path, set_env: SetEnv, content: bytes | None, expected: str
) -> None:
    path = tmp_path / "ca.pem"
    if content is not None:
        path.write_bytes(content)
    set_env(smtp_tls="starttls", smtp_ca_file=str(path))

    with pytest.raises(ValueError, match="NOTIFIER_SMTP_CA_FILE") as caught:
        EmailProvider(get_settings())
    assert expected.lower() in str(caught.value).lower()
    assert str(path) in str(caught.value)
