"""The sms provider against a fake Twilio on loopback.

pytest-httpserver plays Twilio's Messages API for the well-formed answers; ``RawServer`` (a bare
socket in a thread) plays what no HTTP library will: garbage replies and silence.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Response

from notifier.models import Notification
from notifier.providers.base import InvalidNotification, Permanent, Retry, Sent
from notifier.providers.sms import SmsProvider
from notifier.settings import get_settings
from tests.factories import SetEnv
from tests.raw_server import Behaviour, RawServer, garbage, silence

SID = "AC" + "0123456789abcdef" * 2
TOKEN = "s3cret-auth-token"
SENDER = "+15005550006"
SERVICE = "MG" + "fedcba9876543210" * 2
PATH = f"/2010-04-01/Accounts/{SID}/Messages.json"
TO = "+14155550100"

MakeProvider = Callable[..., SmsProvider]


def notification(
    recipient: str = TO, body: str | None = "Your code is 1234", subject: str | None = None
) -> Notification:
    return Notification(
        id=42,
        channel="sms",
        recipient=recipient,
        subject=subject,
        body=body,
        payload={},
        attempts=1,
        max_attempts=5,
        claim_token=uuid4(),
        created_at=datetime.now(UTC),
    )


@pytest.fixture
def make_provider(set_env: SetEnv) -> Iterator[MakeProvider]:
    """Builds providers from the environment, as the registry does; shuts them down after.

    Every ``NOTIFIER_TWILIO_*`` value is set unless given as ``None``, which unsets it.
    """
    made: list[SmsProvider] = []

    def make(base: str, *, timeout: float = 5, **overrides: str | None) -> SmsProvider:
        values: dict[str, str | None] = {
            "account_sid": SID,
            "auth_token": TOKEN,
            "from": SENDER,
            "api_base": base,
        }
        values.update({key.lower(): value for key, value in overrides.items()})
        set_env(**{f"twilio_{key}": value for key, value in values.items()}, sms_timeout=timeout)
        made.append(SmsProvider(get_settings()))
        return made[-1]

    yield make
    for provider in made:
        provider.shutdown()


def base_of(httpserver: HTTPServer) -> str:
    return httpserver.url_for("/").rstrip("/")


# -- a bare TCP server ---------------------------------------------------------------------------


# -- what Twilio answers -> what the provider says -----------------------------------------------


def twilio_error(code: int, message: str, status: int = 400) -> str:
    more = f"https://www.twilio.com/docs/errors/{code}"
    return json.dumps({"code": code, "message": message, "more_info": more, "status": status})


def message(status: str = "queued", **fields: Any) -> str:
    return json.dumps({"sid": "SM" + "a" * 32, "status": status, "error_code": None, **fields})


INVALID_TO = "The 'To' number +1555 is not a valid phone number."
UNSUBSCRIBED = "Attempt to send to unsubscribed recipient"
FAILED = message("failed", error_code=30007, error_message="Message filtered")
MOVED = {"Location": "https://elsewhere.example/"}
RESPONSES = [
    # status, headers, body, outcome type, error fragments, retry_after
    (201, {}, message(), Sent, (), None),
    (200, {}, message("accepted"), Sent, (), None),
    (400, {}, twilio_error(21211, INVALID_TO), Permanent, (f"Twilio 21211: {INVALID_TO}",), None),
    (400, {}, twilio_error(21610, UNSUBSCRIBED), Permanent, (UNSUBSCRIBED, "errors/21610"), None),
    (400, {}, twilio_error(21614, "Not a mobile number"), Permanent, ("Twilio 21614",), None),
    (400, {}, twilio_error(21408, "Region not enabled"), Permanent, ("Twilio 21408",), None),
    (400, {}, "<html>Bad Request</html>", Permanent, ("HTTP 400 from Twilio: <html>",), None),
    (400, {}, twilio_error(21606, "Bad From"), Retry, ("21606", "NOTIFIER_TWILIO_FROM"), None),
    (429, {"Retry-After": "5"}, twilio_error(20429, "Slow", 429), Retry, ("Twilio 20429",), 5.0),
    (500, {}, "boom " * 30_000, Retry, ("HTTP 500 from Twilio: boom",), None),
    (503, {"Retry-After": "2"}, twilio_error(20503, "Down", 503), Retry, ("Twilio 20503",), 2.0),
    (401, {}, twilio_error(20003, "Authenticate", 401), Retry, ("_AUTH_TOKEN",), None),
    (403, {}, "", Retry, ("HTTP 403 from Twilio: (empty body)", "_ACCOUNT_SID"), None),
    (404, {}, twilio_error(20404, "Not Found", 404), Retry, ("NOTIFIER_TWILIO_API_BASE",), None),
    (301, MOVED, "", Retry, ("HTTP 301", "NOTIFIER_TWILIO_API_BASE"), None),
    (200, {}, FAILED, Permanent, ("Twilio 30007: Message filtered", "status failed"), None),
    (201, {}, message("undelivered", error_code=30003), Permanent, ("30003: message undel",), None),
]


@pytest.mark.parametrize(
    ("status", "headers", "body", "kind", "fragments", "retry_after"),
    RESPONSES,
    ids=[f"{r[0]}-{i}" for i, r in enumerate(RESPONSES)],
)
def test_outcome_follows_the_response(
    make_provider: MakeProvider,
    httpserver: HTTPServer,
    status: int,
    headers: dict[str, str],
    body: str,
    kind: type[Sent | Retry | Permanent],
    fragments: tuple[str, ...],
    retry_after: float | None,
) -> None:
    httpserver.expect_oneshot_request(PATH, method="POST").respond_with_response(
        Response(body, status=status, headers=headers, content_type="application/json")
    )
    outcome = make_provider(base_of(httpserver)).send(notification())
    httpserver.check_assertions()
    assert type(outcome) is kind
    if isinstance(outcome, Sent):
        assert outcome.provider_message_id == "SM" + "a" * 32
        return
    for fragment in fragments:
        assert fragment in outcome.error
    assert len(outcome.error) <= 500
    assert TOKEN not in outcome.error
    if isinstance(outcome, Retry):
        assert outcome.retry_after == retry_after
        assert outcome.throttled is (status == 429)


def test_request_is_form_encoded_with_basic_auth(
    make_provider: MakeProvider, httpserver: HTTPServer
) -> None:
    httpserver.expect_oneshot_request(PATH, method="POST").respond_with_data(
        message(), status=201, content_type="application/json"
    )
    body = "Line one\nLine two: 100% ✓ & more"
    row = notification(body=body, subject="not sent: an SMS has no subject")
    outcome = make_provider(base_of(httpserver)).send(row)
    assert isinstance(outcome, Sent)
    ((request, _),) = httpserver.log
    assert request.mimetype == "application/x-www-form-urlencoded"
    assert request.form.to_dict() == {"To": TO, "From": SENDER, "Body": body}
    expected = base64.b64encode(f"{SID}:{TOKEN}".encode()).decode()
    assert request.headers["Authorization"] == f"Basic {expected}"


def test_messaging_service_is_sent_as_messaging_service_sid(
    make_provider: MakeProvider, httpserver: HTTPServer
) -> None:
    httpserver.expect_oneshot_request(PATH, method="POST").respond_with_data(
        message(), status=201, content_type="application/json"
    )
    provider = make_provider(base_of(httpserver), **{"from": SERVICE})
    provider.validate(notification())
    assert isinstance(provider.send(notification()), Sent)
    ((request, _),) = httpserver.log
    assert request.form.to_dict() == {
        "To": TO,
        "MessagingServiceSid": SERVICE,
        "Body": "Your code is 1234",
    }


def test_garbage_reply_is_retried(
    make_provider: MakeProvider, raw_server: Callable[[Behaviour], RawServer]
) -> None:
    server = raw_server(garbage)
    outcome = make_provider(server.url).send(notification())
    assert server.accepted == 1
    assert isinstance(outcome, Retry)
    assert "POSTing to Twilio at 127.0.0.1:" in outcome.error


def test_silent_server_times_out(
    make_provider: MakeProvider, raw_server: Callable[[Behaviour], RawServer]
) -> None:
    server = raw_server(silence)
    provider = make_provider(server.url, timeout=1)
    started = time.monotonic()
    outcome = provider.send(notification())
    elapsed = time.monotonic() - started
    assert server.accepted == 1  # the fault happened: it took the request and said nothing
    assert isinstance(outcome, Retry)
    assert "timed out" in outcome.error
    assert "1s limit (NOTIFIER_SMS_TIMEOUT)" in outcome.error
    assert 0.9 <= elapsed < 3


def test_refused_connection_is_retried(make_provider: MakeProvider) -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]  # closed on leaving the block: nothing listens there now
    outcome = make_provider(f"http://127.0.0.1:{port}").send(notification())
    assert isinstance(outcome, Retry)
    assert "ConnectError" in outcome.error


# -- a deployment that cannot send ---------------------------------------------------------------

MISCONFIGURED = [
    ({"account_sid": None}, "SMS is not configured: set NOTIFIER_TWILIO_ACCOUNT_SID"),
    ({"auth_token": ""}, "SMS is not configured: set NOTIFIER_TWILIO_AUTH_TOKEN"),
    ({"from": None, "auth_token": None}, "set NOTIFIER_TWILIO_AUTH_TOKEN, NOTIFIER_TWILIO_FROM"),
    ({"api_base": "http://api.twilio.example"}, "NOTIFIER_TWILIO_API_BASE"),
    ({"api_base": "api.twilio.com"}, "is not an https:// URL"),
    ({"api_base": "https://api.twilio.com:99999"}, "is not an https:// URL"),
]


@pytest.mark.parametrize(("overrides", "message"), MISCONFIGURED, ids=[m for _, m in MISCONFIGURED])
def test_missing_configuration_is_retried_without_a_request(
    make_provider: MakeProvider,
    httpserver: HTTPServer,
    overrides: dict[str, str | None],
    message: str,
) -> None:
    provider = make_provider(base_of(httpserver), **overrides)  # building it does not raise
    row = notification()
    provider.validate(row)  # not the producer's fault: the row stays valid
    outcome = provider.send(row)
    assert isinstance(outcome, Retry)
    assert message in outcome.error
    assert httpserver.log == []


# -- rows that can never be sent -----------------------------------------------------------------

INVALID = [
    # recipient, body, what the error says
    ("0612", "Hi", "recipient '0612' is not an E.164 phone number like +14155550100"),
    ("+1 415 555 0100", "Hi", "not an E.164"),
    ("+04155550100", "Hi", "not an E.164"),
    ("+12345", "Hi", "not an E.164"),
    ("+1234567890123456", "Hi", "not an E.164"),
    ("+1415555\uff10\uff11\uff10\uff10", "Hi", "not an E.164"),  # fullwidth digits
    (TO + "\n", "Hi", "not an E.164"),
    ("", "Hi", "not an E.164"),
    (TO, None, "body is empty"),
    (TO, " \n ", "body is empty"),
    (TO, "x" * 1601, "body is 1601 characters; Twilio sends at most 1600"),
]


@pytest.mark.parametrize(
    ("recipient", "body", "message"), INVALID, ids=[f"{i}" for i in range(len(INVALID))]
)
def test_invalid_rows_are_refused(
    make_provider: MakeProvider, recipient: str, body: str | None, message: str
) -> None:
    provider = make_provider("https://api.twilio.com")  # validate() never connects
    with pytest.raises(InvalidNotification, match=re.escape(message)):
        provider.validate(notification(recipient, body))


@pytest.mark.parametrize(
    ("recipient", "body", "subject", "sender"),
    [
        (TO, "Your code is 1234", None, SENDER),
        ("+4915112345678", "x" * 1600, None, SENDER),
        (TO, "two\nlines", "ignored: an SMS has no subject", SENDER),
        ("+1234567", "Hi", None, SERVICE),  # a Messaging Service as sender
        (TO, "Hi", None, "Acme"),  # an alphanumeric sender ID
    ],
)
def test_valid_rows_pass(
    make_provider: MakeProvider, recipient: str, body: str, subject: str | None, sender: str
) -> None:
    provider = make_provider("https://api.twilio.com", **{"from": sender})
    provider.validate(notification(recipient, body, subject))


def test_concurrent_sends_share_one_client(
    make_provider: MakeProvider, httpserver: HTTPServer
) -> None:
    httpserver.expect_request(PATH, method="POST").respond_with_data(
        message(), status=201, content_type="application/json"
    )
    provider = make_provider(base_of(httpserver))
    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(provider.send, [notification(body=f"n{i}") for i in range(24)]))
    assert all(isinstance(o, Sent) for o in outcomes)
    bodies = sorted(request.form["Body"] for request, _ in httpserver.log)
    assert bodies == sorted(f"n{i}" for i in range(24))
