"""The ``ses`` provider, with aiobotocore as the client, against real HTTP servers on loopback.

SES itself is moto in server mode (``ThreadedMotoServer``, a real implementation of the SES v2
API): the tests verify an identity in it, send, and read back what it stored from its
``/moto-api/data.json``. A recording proxy in front of it keeps each request as it went on the
wire (moto drops tags and configuration sets). What moto cannot be made to answer (throttling,
5xx, a paused account) comes from pytest-httpserver answering SES's documented error format:
the status, ``x-amzn-ErrorType`` and a JSON ``message``. A bare socket plays the server that
never answers, and a closed port the one that is not there.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable, Iterator
from email import message_from_bytes
from email.policy import default as default_policy
from typing import Any

import httpx
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pytest_httpserver import HTTPServer
from sqlalchemy import Engine, text
from werkzeug import Request, Response

from notifier import eventloop
from notifier.delivery.dispatcher import Dispatcher
from notifier.events import sns
from notifier.events.state import Applier
from notifier.models import Notification
from notifier.providers import chains, registry_of
from notifier.providers.base import Permanent, Retry, Sent
from notifier.providers.email import EmailProvider
from notifier.providers.ses import DEPLOYMENT_PAUSE_SECONDS, SesProvider
from notifier.settings import Settings, get_settings
from tests.esp_servers import running
from tests.factories import MakeRow, SetEnv, claimed
from tests.raw_server import RawServer, silence
from tests.ses_server import Recorder, moto_ses, recording, reset, stored
from tests.ses_server import verify as verify_identity

REGION = "eu-west-1"
SENDER = "shop@shop.example"

MakeProvider = Callable[..., SesProvider]


def notification(id: int = 42, recipient: str = "ann@example.com", **fields: Any) -> Notification:
    values: dict[str, Any] = {
        "subject": "Your code: SPRING-25 ✓",
        "body": "Hello Ann, your code is SPRING-25.",
        "payload": {"html": "<p>Hello Ann</p>", "campaign": "spring"},
        "category": "marketing",
    }
    return claimed("email", recipient, id, **{**values, **fields})


# -- the servers ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moto() -> Iterator[str]:
    with moto_ses() as url:
        yield url


@pytest.fixture
def recorder(moto: str) -> Iterator[Recorder]:
    reset(moto)
    with recording(moto) as found:
        yield found


def verify(moto: str, identity: str) -> None:
    verify_identity(moto, identity, REGION)


def shape(raw: bytes) -> list[tuple[str, str]]:
    """A message's headers and parts, less what changes each time one is composed."""
    message = message_from_bytes(raw, policy=default_policy)
    varying = {"date", "list-unsubscribe", "content-type"}
    found = [(k, v) for k, v in message.items() if k.lower() not in varying]
    for part in message.walk():
        found.append(
            (part.get_content_type(), part.get_payload() if not part.is_multipart() else "")
        )
    return found


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's default chain finds keys in the environment, and nothing else of this machine."""
    for name in ("AWS_PROFILE", "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDNOTIFIERTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def make_provider(aws: None, set_env: SetEnv) -> Iterator[MakeProvider]:
    """Builds providers from the environment, the way the registry does; shuts them down after."""
    made: list[SesProvider] = []

    def make(endpoint: str, *, timeout: float = 5, **more: Any) -> SesProvider:
        set_env(
            ses_endpoint_url=endpoint,
            ses_region=REGION,
            ses_timeout=timeout,
            email_from=f"Shop <{SENDER}>",
            failover="email=ses,email",
            events_public_url="https://events.example.test",
            unsubscribe_secret="unsubscribe-secret-test",
            **more,
        )
        made.append(SesProvider(get_settings()))
        return made[-1]

    yield make
    for provider in made:
        provider.shutdown()


# -- a message sent through SES --------------------------------------------------------------------


def test_sends_the_smtp_providers_message_with_its_tag_and_stores_ses_message_id(
    moto: str, recorder: Recorder, make_provider: MakeProvider
) -> None:
    verify(moto, "shop.example")
    provider = make_provider(recorder.url, ses_configuration_set="notifier-events")
    assert provider.problem() is None
    row = notification()

    outcome = provider.send(row)

    [kept] = stored(moto)
    assert outcome == Sent(kept["id"])
    [request] = recorder.sends()
    assert request["EmailTags"] == [{"Name": "notifier_id", "Value": "42"}]
    assert request["ConfigurationSetName"] == "notifier-events"
    assert request["FromEmailAddress"] == SENDER
    assert request["Destination"] == {"ToAddresses": ["ann@example.com"]}
    signed = recorder.requests[-1].headers["authorization"]
    assert signed.startswith("AWS4-HMAC-SHA256 Credential=AKIDNOTIFIERTEST/")
    assert f"/{REGION}/ses/aws4_request" in signed  # the region, the chain's keys

    # The SMTP provider's message, but for what differs per composition: the date, the sealed
    # unsubscribe token and the MIME boundaries.
    raw = kept["raw_data"].encode()
    smtp = EmailProvider(get_settings())._compose(row, "<notification-42@shop.example>")
    assert shape(raw) == shape(smtp)
    message = message_from_bytes(raw, policy=default_policy)
    assert message["Message-ID"] == "<notification-42@shop.example>"
    assert message["X-Notifier-Id"] == "42"
    assert message["Subject"] == "Your code: SPRING-25 ✓"
    assert message["From"] == f"Shop <{SENDER}>"
    assert message["List-Unsubscribe"].startswith("<https://events.example.test/")
    assert message["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert [part.get_content_type() for part in message.walk()] == [
        "multipart/alternative",
        "text/plain",
        "text/html",
    ]


def test_one_client_serves_every_batch_until_shutdown(
    moto: str, recorder: Recorder, make_provider: MakeProvider
) -> None:
    verify(moto, SENDER)
    provider = make_provider(recorder.url)
    for n in range(3):
        assert isinstance(provider.send(notification(id=n + 1)), Sent)
        provider.close()  # the end of a batch
    assert recorder.connections == 1
    provider.shutdown()
    assert isinstance(provider.send(notification(id=9)), Sent)
    assert recorder.connections == 2
    assert len(stored(moto)) == 4


def test_many_sends_at_once_on_the_loop_each_carry_their_rows_tag(
    moto: str, recorder: Recorder, make_provider: MakeProvider
) -> None:
    verify(moto, SENDER)
    provider = make_provider(recorder.url)

    async def burst() -> list[Any]:
        return await asyncio.gather(*(provider.send_async(notification(id=n)) for n in range(30)))

    outcomes = eventloop.run(burst())
    assert all(isinstance(o, Sent) for o in outcomes)
    assert sorted(o.provider_message_id for o in outcomes) == sorted(m["id"] for m in stored(moto))
    tags = sorted(int(r["EmailTags"][0]["Value"]) for r in recorder.sends())
    assert tags == list(range(30))


def test_no_credentials_anywhere_is_retried_naming_the_chain(
    httpserver: HTTPServer, make_provider: MakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = make_provider(httpserver.url_for(""))
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    outcome = provider.send(notification())
    assert httpserver.log == []  # nothing unsigned went out
    assert isinstance(outcome, Retry)
    assert "Unable to locate credentials" in outcome.error
    assert "AWS_ACCESS_KEY_ID" in outcome.error


def test_a_chain_picks_ses_before_smtp(make_provider: MakeProvider) -> None:
    ses = make_provider("http://127.0.0.1:9")
    s = get_settings()
    chain = chains(registry_of([EmailProvider(s), ses]), s.failover)
    assert [p.name or p.channel for p in chain["email"]] == ["ses", "email"]


def test_an_unverified_sender_is_the_deployments_to_fix_not_the_rows(
    moto: str, recorder: Recorder, make_provider: MakeProvider
) -> None:
    verify(moto, "other.example")
    outcome = make_provider(recorder.url).send(notification())
    assert len(recorder.sends()) == 1  # it did reach SES, which refused it
    assert stored(moto) == []
    assert isinstance(outcome, Retry)
    assert not outcome.throttled
    assert "MessageRejected" in outcome.error
    assert "Did not have authority" in outcome.error
    assert "verify NOTIFIER_EMAIL_FROM" in outcome.error


# -- what SES answers -> what the row gets -------------------------------------------------------


def ses_error(status: int, code: str, message: str, **headers: str) -> Response:
    """An error as SES v2 answers it: the code in ``x-amzn-ErrorType``, a JSON message."""
    return Response(
        json.dumps({"message": message}),
        status=status,
        headers={"x-amzn-ErrorType": f"{code}:http://internal.amazon.com/coral/", **headers},
        content_type="application/json",
    )


PAUSE = DEPLOYMENT_PAUSE_SECONDS
ANSWERS: list[tuple[str, Response, type, bool, float | None, str]] = [
    (
        "throttled",
        ses_error(
            429, "TooManyRequestsException", "Maximum sending rate exceeded", **{"retry-after": "7"}
        ),
        Retry, True, 7.0, "Maximum sending rate exceeded",
    ),
    ("v1 throttling", ses_error(400, "Throttling", "Rate exceeded"), Retry, True, None, "Rate"),
    (
        "quota", ses_error(400, "LimitExceededException", "Daily message quota exceeded."),
        Retry, True, PAUSE, "quota",
    ),
    (
        "paused", ses_error(400, "SendingPausedException", "Sending paused."),
        Retry, True, PAUSE, "resume it",
    ),
    (
        "suspended", ses_error(400, "AccountSuspendedException", "Suspended."),
        Retry, True, PAUSE, "suspended",
    ),
    (
        "mail from", ses_error(400, "MailFromDomainNotVerifiedException", "No MX."),
        Retry, False, None, "MAIL FROM",
    ),
    (
        "config set", ses_error(404, "NotFoundException", "Configuration set x does not exist."),
        Retry, False, None, "NOTIFIER_SES_CONFIGURATION_SET",
    ),
    (
        "sandbox",
        ses_error(400, "MessageRejected", "Email address is not verified. The following"
                  " identities failed the check in region EU-WEST-1: ann@example.com"),
        Retry, False, None, "sandbox",
    ),
    (
        "keys",
        ses_error(403, "UnrecognizedClientException", "The security token is invalid."),
        Retry, False, None, "AWS_ACCESS_KEY_ID",
    ),
    (
        "rejected", ses_error(400, "MessageRejected", "Illegal address"),
        Permanent, False, None, "Illegal address",
    ),
    (
        "bad request", ses_error(400, "BadRequestException", "Invalid raw message."),
        Permanent, False, None, "BadRequestException",
    ),
    ("5xx", ses_error(500, "InternalFailure", "oops"), Retry, False, None, "HTTP 500"),
    (
        "5xx garbage", Response(b"\xff<html>bad gateway", status=502),
        Retry, False, None, "HTTP 502",
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("answer", "kind", "throttled", "retry_after", "says"),
    [pytest.param(*a[1:], id=a[0]) for a in ANSWERS],
)
def test_ses_answers_become_outcomes(
    httpserver: HTTPServer,
    make_provider: MakeProvider,
    answer: Response,
    kind: type,
    throttled: bool,
    retry_after: float | None,
    says: str,
) -> None:
    httpserver.expect_request("/v2/email/outbound-emails", method="POST").respond_with_response(
        answer
    )
    outcome = make_provider(httpserver.url_for("")).send(notification())
    assert len(httpserver.log) == 1  # one request: the SDK itself retries nothing
    assert isinstance(outcome, kind), outcome
    assert says in outcome.error
    if isinstance(outcome, Retry):
        assert (outcome.throttled, outcome.retry_after) == (throttled, retry_after)


@pytest.mark.parametrize("status", [301, 307])
def test_a_redirect_is_never_taken_for_ses_answering(
    httpserver: HTTPServer, make_provider: MakeProvider, status: int
) -> None:
    elsewhere = httpserver.url_for("/elsewhere")
    httpserver.expect_request("/v2/email/outbound-emails").respond_with_response(
        Response(b"", status=status, headers={"Location": elsewhere})
    )
    httpserver.expect_request("/elsewhere").respond_with_json({"MessageId": "not-from-ses"})
    outcome = make_provider(httpserver.url_for("")).send(notification())
    assert [request.path for request, _ in httpserver.log][-1] == "/elsewhere"  # it was followed
    assert isinstance(outcome, Retry)
    assert f"HTTP {status} redirecting to {elsewhere}" in outcome.error
    assert "NOTIFIER_SES_ENDPOINT_URL" in outcome.error


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"not json at all", None),
        (json.dumps({"MessageId": "x" * 5000}).encode(), None),
        (json.dumps({"MessageId": "bad\nid"}).encode(), None),
        (json.dumps({"MessageId": "0100018c-ok-000000"}).encode(), "0100018c-ok-000000"),
    ],
)
def test_a_success_is_sent_even_when_its_message_id_is_unusable(
    httpserver: HTTPServer, make_provider: MakeProvider, body: bytes, expected: str | None
) -> None:
    httpserver.expect_request("/v2/email/outbound-emails").respond_with_data(
        body, content_type="application/json"
    )
    assert make_provider(httpserver.url_for("")).send(notification()) == Sent(expected)


def test_a_server_that_never_answers_is_retried_within_the_timeout(
    raw_server: Callable[..., RawServer], make_provider: MakeProvider
) -> None:
    server = raw_server(silence)
    provider = make_provider(server.url, timeout=1)
    started = time.monotonic()
    outcome = provider.send(notification())
    took = time.monotonic() - started
    assert server.accepted == 1  # the request reached it, and it kept silent
    assert isinstance(outcome, Retry)
    assert "timed out" in outcome.error
    assert took < 3 * 1 + 5  # the whole send's limit, with room for a slow machine


def test_a_closed_port_is_retried(make_provider: MakeProvider) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    outcome = make_provider(f"http://127.0.0.1:{port}").send(notification())
    assert isinstance(outcome, Retry)
    assert f"127.0.0.1:{port}" in outcome.error


_CODES = st.sampled_from(
    ["MessageRejected", "TooManyRequestsException", "SendingPausedException", "NotFoundException"]
) | st.text(max_size=80)


def test_any_answer_becomes_an_outcome(httpserver: HTTPServer, make_provider: MakeProvider) -> None:
    provider = make_provider(httpserver.url_for(""), timeout=2)
    answered: list[int] = []

    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        status=st.integers(200, 599),
        code=_CODES,
        body=st.binary(max_size=300) | st.text(max_size=300).map(str.encode),
        json_body=st.booleans(),
    )
    def check(status: int, code: str, body: bytes, json_body: bool) -> None:
        if json_body:
            body = json.dumps({"message": body.decode("utf-8", "replace"), "__type": code}).encode()

        def answer(_: Request) -> Response:
            answered.append(status)
            headers = {"x-amzn-ErrorType": code.encode("utf-8", "replace").decode("latin-1")}
            return Response(body, status=status, headers=headers)

        httpserver.clear()
        httpserver.expect_request("/v2/email/outbound-emails").respond_with_handler(answer)
        outcome = provider.send(notification())
        assert answered[-1] == status  # this example's answer was the one read
        assert isinstance(outcome, Sent | Retry | Permanent)
        if isinstance(outcome, Sent):
            assert 200 <= status < 300
        else:
            assert len(outcome.error) <= 500
            assert outcome.error.isprintable()

    check()


# -- settings ------------------------------------------------------------------------------------


def test_problem_names_the_missing_region_only_when_a_chain_uses_ses(
    aws: None, set_env: SetEnv
) -> None:
    set_env(failover="email=ses")
    unused = SesProvider(Settings(failover={}))
    assert unused.problem() is None
    problem = SesProvider(get_settings()).problem()
    assert problem is not None
    assert "NOTIFIER_SES_REGION" in problem
    outcome = SesProvider(get_settings()).send(notification())
    assert outcome == Retry(problem)
    set_env(ses_region=REGION, ses_endpoint_url="http://ses.example.com")
    plain = SesProvider(get_settings()).problem()
    assert plain is not None
    assert "https" in plain
    set_env(ses_endpoint_url="https://vpce-1.email.eu-west-1.vpce.amazonaws.com")
    assert SesProvider(get_settings()).problem() is None


def test_the_sdk_region_is_used_when_notifier_names_none(
    aws: None, set_env: SetEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-southeast-2")
    set_env(failover="email=ses")
    provider = SesProvider(get_settings())
    assert provider.problem() is None
    assert provider._region == "ap-southeast-2"


# -- the way back: SES's events find the row -----------------------------------------------------


def test_an_ses_event_built_from_what_the_send_produced_finds_its_row(
    moto: str,
    recorder: Recorder,
    make_provider: MakeProvider,
    make_row: MakeRow,
    engine: Engine,
    redis_url: str,
) -> None:
    """A row sent by a real dispatcher through ``email=ses``; then SES's reports about it, as
    SNS delivers them, each naming the row only one way: by tag, by header, by SES's id."""
    verify(moto, SENDER)
    rows = [
        make_row(channel="email", recipient=f"r{n}@example.com", subject="hi") for n in (1, 2, 3)
    ]
    ses = make_provider(recorder.url)
    dispatcher = Dispatcher(
        engine, registry_of([EmailProvider(get_settings()), ses]), get_settings()
    )
    dispatcher.run_once()
    dispatcher.close()
    with engine.begin() as conn:
        sent = conn.execute(
            text("SELECT id, status, provider, provider_message_id FROM notifications ORDER BY id")
        ).all()
    by_id = {m["id"]: m for m in stored(moto)}
    assert [(r.id, r.status, r.provider) for r in sent] == [(i, "sent", "ses") for i in rows]
    assert {r.provider_message_id for r in sent} == set(by_id)  # SES's ids, stored
    requests = {int(r["EmailTags"][0]["Value"]): r for r in recorder.sends()}
    message_ids = {r.id: r.provider_message_id for r in sent}

    def report(row: int, mail: dict[str, Any]) -> dict[str, Any]:
        """An SNS notification of an SES bounce, as SES's documentation shows one."""
        event = {
            "eventType": "Bounce",
            "bounce": {
                "bounceType": "Permanent",
                "bounceSubType": "General",
                "bouncedRecipients": [{"emailAddress": f"r{rows.index(row) + 1}@example.com"}],
                "timestamp": "2026-12-01T10:00:00.000Z",
            },
            # SES replaces the Message-ID with its own: the one it reports is not notifier's
            "mail": {
                "commonHeaders": {"messageId": f"<{message_ids[row]}@email.amazonses.com>"},
                **mail,
            },
        }
        return {"Type": "Notification", "Message": json.dumps(event)}

    first, second, third = rows
    tags = {t["Name"]: [t["Value"]] for t in requests[first]["EmailTags"]}
    raw = message_from_bytes(by_id[message_ids[second]]["raw_data"].encode(), policy=default_policy)
    events = [
        *sns.events(report(first, {"tags": {"ses:configuration-set": ["set"], **tags}})),
        *sns.events(report(second, {"headers": [{"name": k, "value": v} for k, v in raw.items()]})),
        *sns.events(report(third, {"messageId": message_ids[third]})),
    ]
    assert [e.notification_id for e in events] == [first, second, None]
    client = redis.Redis.from_url(redis_url)
    try:
        applied = Applier(engine, client, get_settings()).apply_all(events)
    finally:
        client.close()
    assert [(a.row_id, a.advanced, a.mismatched) for a in applied] == [
        (row, True, False) for row in rows
    ]
    with engine.begin() as conn:
        states = conn.execute(text("SELECT delivery_status FROM notifications ORDER BY id")).all()
    assert [s for (s,) in states] == ["bounced"] * 3


# -- the benchmark's SES server ------------------------------------------------------------------


def test_the_benchmarks_ses_server_takes_what_the_sdk_sends_and_throttles_as_ses_does(
    make_provider: MakeProvider,
) -> None:
    """``bench/email.py`` measures SES against ``esp_servers``' SES of the published format, not
    moto: what the provider sends passes its check against the SDK's own service model, the row
    is found by its tag, and the server's rate limit reads as SES's throttle."""
    with running("ses") as server:
        provider = make_provider(server.url)
        sent = provider.send(notification(7, "ann@example.com"))
        assert isinstance(sent, Sent)
        assert (sent.provider_message_id or "").startswith("0100")
        (taken,) = server.taken
        assert (taken["to"], taken["metadata"]) == ("ann@example.com", {"notifier_id": "7"})
        assert taken["subject"] == "Your code: SPRING-25 ✓"
        assert taken["headers"]["X-Notifier-Id"] == "7"
        server.limit = 0.5  # less than one message in the bucket: the next is refused
        throttled = provider.send(notification(8))
        assert isinstance(throttled, Retry)
        assert throttled.throttled, throttled
        assert "TooManyRequestsException" in throttled.error
        assert server.violations == []


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"Content": {"Raw": {"Data": "aGk="}}, "Unknown": 1}, "SendEmailRequest.Unknown"),
        ({"Content": {"Raw": {}}}, "SendEmailRequest.Content.Raw.Data is required"),
        ({"Content": {"Raw": {"Data": "aGk="}}, "EmailTags": "x"}, "must be an array"),
        ({"Content": {"Raw": {"Data": "aGk="}}, "FromEmailAddress": 3}, "must be a string"),
        ({"Content": {"Raw": {"Data": "%%%"}}}, "base64"),
    ],
)
def test_the_benchmarks_ses_server_refuses_a_request_off_the_model(
    body: dict[str, Any], says: str
) -> None:
    with running("ses") as server:
        answer = httpx.post(
            server.url + "/v2/email/outbound-emails",
            json=body,
            headers={"Authorization": "AWS4-HMAC-SHA256 Credential=AKID/x"},
            timeout=5,
        )
    assert answer.status_code == 400
    assert answer.headers["x-amzn-ErrorType"] == "BadRequestException"
    (violation,) = server.violations
    assert says in violation
