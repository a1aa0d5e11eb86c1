"""The ``sendgrid``, ``mailgun`` and ``postmark`` providers against loopback servers of each
API's published format (``tests/esp_servers.py``), which check every request they get.

Each test that expects a failure first shows the server saw the request (or, for a refusal
before any request, that it saw none), and every test ends by asserting that notifier broke
none of the formats (``violations``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from notifier import eventloop
from notifier.models import Notification
from notifier.providers.base import Outcome, Permanent, Retry, Sent
from notifier.providers.esp import EspProvider
from notifier.providers.mailgun import MailgunProvider
from notifier.providers.postmark import PostmarkProvider
from notifier.providers.sendgrid import SendGridProvider
from notifier.settings import Settings
from tests.esp_servers import (
    MAILGUN_DOMAIN,
    MAILGUN_KEY,
    POSTMARK_TOKEN,
    SENDGRID_KEY,
    EspServer,
    running,
)

KINDS = ("sendgrid", "mailgun", "postmark")
CLASSES: dict[str, type[EspProvider]] = {
    "sendgrid": SendGridProvider,
    "mailgun": MailgunProvider,
    "postmark": PostmarkProvider,
}
JSON = {"Content-Type": "application/json"}


def configured(kind: str, url: str, **more: Any) -> Settings:
    values: dict[str, Any] = {
        "email_from": "Shop <news@shop.example>",
        "sendgrid": {"sendgrid_api_key": SENDGRID_KEY, "sendgrid_api_base": url},
        "mailgun": {
            "mailgun_api_key": MAILGUN_KEY,
            "mailgun_domain": MAILGUN_DOMAIN,
            "mailgun_api_base": url,
        },
        "postmark": {"postmark_server_token": POSTMARK_TOKEN, "postmark_api_base": url},
    }
    return Settings(email_from=values["email_from"], **{**values[kind], **more})


def row(n: int, recipient: str | None = None, **fields: Any) -> Notification:
    values: dict[str, Any] = {
        "subject": f"Your code, {n}",
        "body": "Use SPRING at checkout.",
        "payload": {"html": "<p>Use <b>SPRING</b></p>"},
    }
    values.update(fields)
    return Notification(
        id=n,
        channel="email",
        recipient=recipient or f"user{n}@example.com",
        attempts=1,
        max_attempts=5,
        claim_token=uuid4(),
        created_at=datetime.now(UTC),
        **values,
    )


Make = Callable[..., tuple[EspProvider, EspServer]]


@pytest.fixture
def esp() -> Iterator[Make]:
    """``esp("sendgrid", esp_timeout=1)``: a provider and the server it sends to."""
    made: list[tuple[EspProvider, EspServer]] = []
    with running("sendgrid") as sg, running("mailgun") as mg, running("postmark") as pm:
        servers = {"sendgrid": sg, "mailgun": mg, "postmark": pm}

        def make(kind: str, **more: Any) -> tuple[EspProvider, EspServer]:
            server = servers[kind]
            provider = CLASSES[kind](configured(kind, server.url, **more))
            assert provider.problem() is None
            made.append((provider, server))
            return provider, server

        yield make
        for provider, server in made:
            provider.shutdown()
            assert server.violations == []


def send(provider: EspProvider, rows: Sequence[Notification]) -> list[Outcome]:
    return eventloop.run(provider.send_batch_async(rows))


# -- one row: the answers and what they mean -----------------------------------------------------

LATER = "Wed, 21 Oct 2099 07:28:00 GMT"


def _kind_error(kind: str, status: int) -> tuple[int, dict[str, str], bytes]:
    doc: Any = {
        "sendgrid": {"errors": [{"message": "boom", "field": None}]},
        "mailgun": {"message": "boom"},
        "postmark": {"ErrorCode": 300, "Message": "boom"},
    }[kind]
    return status, JSON, json.dumps(doc).encode()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ((429, {"Retry-After": "17"}, b""), Retry("", 17.0, throttled=True)),
        ((429, {"Retry-After": "-5"}, b""), Retry("", None, throttled=True)),
        ((429, {"Retry-After": "NaN"}, b""), Retry("", None, throttled=True)),
        ((503, {}, b"<html>down</html>"), Retry("")),
        ((500, {}, b""), Retry("")),
        ((408, {}, b""), Retry("")),
        ((401, {}, b'{"errors": "nope"}'), Retry("check NOTIFIER_")),
        ((403, {}, b""), Retry("check NOTIFIER_")),
        ((404, {}, b""), Retry("check NOTIFIER_")),
        ((302, {"Location": "https://evil.example/"}, b""), Retry("check NOTIFIER_")),
        ((200, JSON, b"[" * 100_000), Sent(None)),  # deep JSON: a 2xx is still accepted
        ((202, {}, b"\xff\xfe not utf-8"), Sent(None)),
        ((200, JSON, b'{"id": 7, "MessageID": ["x"], "ErrorCode": "zero"}'), Sent(None)),
        ((200, {}, b"x" * 3_000_000), Sent(None)),  # huge: read no further than a cap
    ],
)
def test_a_single_send_means_what_the_answer_says(
    esp: Make, kind: str, answer: tuple[int, dict[str, str], bytes], expected: Outcome
) -> None:
    provider, server = esp(kind)
    server.answers.append(answer)
    [outcome] = send(provider, [row(1)])
    assert len(server.requests) == 1  # the answer was the server's, not a failure to connect
    assert type(outcome) is type(expected)
    if isinstance(expected, Retry):
        assert isinstance(outcome, Retry)
        assert (outcome.throttled, outcome.retry_after) == (
            expected.throttled,
            expected.retry_after,
        )
        assert expected.error in outcome.error
        if "check NOTIFIER_" in expected.error:
            assert CLASSES[kind].endpoint.split()[0] in outcome.error or (
                CLASSES[kind].credentials.split()[0] in outcome.error
            )
    elif isinstance(expected, Sent):
        assert outcome == Sent(None)


@pytest.mark.parametrize("kind", KINDS)
def test_a_rate_limit_reset_time_is_honoured(esp: Make, kind: str) -> None:
    provider, server = esp(kind)
    server.answers.append(
        (429, {"X-RateLimit-Reset": "4102444800", "X-RateLimit-Remaining": "0"}, b"")
    )
    [outcome] = send(provider, [row(1)])
    assert isinstance(outcome, Retry)
    assert outcome.throttled
    assert outcome.retry_after == 86_400.0  # 2100-01-01 is further than any wait believed


@pytest.mark.parametrize("kind", KINDS)
def test_an_accepted_send_stores_the_providers_message_id(esp: Make, kind: str) -> None:
    provider, server = esp(kind)
    [outcome] = send(provider, [row(1)])
    assert isinstance(outcome, Sent)
    assert outcome.provider_message_id
    [message] = server.messages
    assert message["to"] == "user1@example.com"
    assert message["subject"] == "Your code, 1"
    assert message["text"] == "Use SPRING at checkout."
    assert message["html"] == "<p>Use <b>SPRING</b></p>"
    assert message["headers"]["Message-ID"] == "<notification-1@shop.example>"
    assert message["headers"]["X-Notifier-Id"] == "1"


@pytest.mark.parametrize("kind", KINDS)
def test_an_invalid_address_is_permanent(esp: Make, kind: str) -> None:
    provider, server = esp(kind)
    [outcome] = send(provider, [row(1, "bad1@example.com")])
    assert len(server.requests) == 1
    assert isinstance(outcome, Permanent)
    assert not outcome.suppress


def test_postmark_suppresses_an_inactive_recipient(esp: Make) -> None:
    provider, server = esp("postmark")
    [outcome] = send(provider, [row(1, "inactive1@example.com")])
    assert len(server.requests) == 1
    assert isinstance(outcome, Permanent)
    assert outcome.suppress
    assert "406" in outcome.error


def test_postmark_names_the_setting_for_a_bad_token_and_an_unknown_stream(esp: Make) -> None:
    provider, server = esp("postmark", postmark_server_token="wrong")
    [outcome] = send(provider, [row(1)])
    assert isinstance(outcome, Retry)
    assert "NOTIFIER_POSTMARK_SERVER_TOKEN" in outcome.error
    provider, server = esp("postmark")
    server.answers.append(
        (*_kind_error("postmark", 422)[:2], b'{"ErrorCode": 1235, "Message": "no stream"}')
    )
    [outcome] = send(provider, [row(1)])
    assert isinstance(outcome, Retry)
    assert "NOTIFIER_POSTMARK_MESSAGE_STREAM" in outcome.error


@pytest.mark.parametrize("kind", KINDS)
def test_a_slow_provider_times_out_every_row_of_the_request(esp: Make, kind: str) -> None:
    provider, server = esp(kind, esp_timeout=0.3)
    server.delay = 2.0
    outcomes = send(provider, [row(n) for n in range(1, 4)])
    assert len(server.requests) == 1  # one request arrived; its answer did not come in time
    assert all(isinstance(o, Retry) and "timed out" in o.error for o in outcomes)


@pytest.mark.parametrize("kind", KINDS)
def test_a_missing_credential_is_named_and_nothing_is_sent(kind: str) -> None:
    provider = CLASSES[kind](Settings(email_from="news@shop.example"))
    problem = provider.problem()
    assert problem is not None
    assert "NOTIFIER_" in problem
    [outcome] = eventloop.run(provider.send_batch_async([row(1)]))
    assert outcome == Retry(problem)


@pytest.mark.parametrize("kind", KINDS)
def test_plain_http_is_refused_off_loopback(kind: str) -> None:
    base = {"sendgrid": "sendgrid_api_base", "mailgun": "mailgun_api_base"}.get(
        kind, "postmark_api_base"
    )
    s = configured(kind, "http://127.0.0.1:1")
    assert CLASSES[kind](s).problem() is None
    problem = CLASSES[kind](s.model_copy(update={base: "http://api.example.com"})).problem()
    assert problem is not None
    assert "plain http" in problem


# -- header safety -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "fields",
    [
        {"subject": "Hi\r\nBcc: eve@evil.example"},
        {"subject": "=?utf-8?q?Hi=0D=0ABcc:_eve@evil.example?="},
        {"payload": {"headers": {"X-Campaign": "a\r\nBcc: eve@evil.example"}}},
        {"payload": {"headers": {"Bcc": "eve@evil.example"}}},
    ],
)
def test_crlf_never_becomes_a_header(esp: Make, kind: str, fields: dict[str, Any]) -> None:
    provider, server = esp(kind)
    outcomes = send(provider, [row(1, **fields), row(2)])
    if "=?" in str(fields.get("subject")):  # text that only looks encoded: sent as written
        assert all(isinstance(o, Sent) for o in outcomes)
        [first] = [m for m in server.messages if m["to"] == "user1@example.com"]
        assert first["subject"] == fields["subject"]
    else:
        assert isinstance(outcomes[0], Permanent)
        assert isinstance(outcomes[1], Sent)
        assert [m["to"] for m in server.messages] == ["user2@example.com"]
    for message in server.messages:
        assert "bcc" not in {h.lower() for h in message["headers"]}


# -- batches -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_campaigns_rows_share_requests_and_keep_their_own_fields(esp: Make, kind: str) -> None:
    provider, server = esp(kind)
    rows = [
        row(n, payload={"html": "<p>Same</p>", "headers": {"X-Row": f"r{n}"}}) for n in range(1, 8)
    ]
    outcomes = send(provider, rows)
    assert all(isinstance(o, Sent) and o.provider_message_id for o in outcomes)
    assert len(server.requests) == 1
    by_address = {m["to"]: m for m in server.messages}
    for n in range(1, 8):
        message = by_address[f"user{n}@example.com"]
        assert message["subject"] == f"Your code, {n}"
        assert message["headers"]["X-Row"] == f"r{n}"
        assert message["headers"]["Message-ID"] == f"<notification-{n}@shop.example>"
        key = "notifier-id" if kind == "postmark" else "notifier_id"
        assert message["metadata"][key] == str(n)


@pytest.mark.parametrize("kind", ["sendgrid", "mailgun"])
def test_rows_of_other_content_go_in_other_requests(esp: Make, kind: str) -> None:
    provider, server = esp(kind)
    rows = [row(n, body=f"body {n % 2}") for n in range(1, 7)]
    assert all(isinstance(o, Sent) for o in send(provider, rows))
    assert len(server.requests) == 2
    assert sorted(len(r.messages) for r in server.requests) == [3, 3]


@pytest.mark.parametrize("kind", KINDS)
def test_one_bad_recipient_does_not_cost_its_neighbours_their_message(esp: Make, kind: str) -> None:
    provider, server = esp(kind)
    rows = [row(n, "bad3@example.com" if n == 3 else None) for n in range(1, 6)]
    outcomes = send(provider, rows)
    assert isinstance(outcomes[2], Permanent)
    assert [type(o) for i, o in enumerate(outcomes) if i != 2] == [Sent] * 4
    delivered = {m["to"] for r in server.requests for m in r.messages}
    assert len(delivered) == 5  # the bad one was sent (and refused), then the rest
    first = len(server.requests[0].messages)
    assert first == 5  # one request for all of them first
    if kind == "postmark":
        assert len(server.requests) == 1  # answered per message: nothing sent twice
    elif kind == "sendgrid":
        assert [len(r.messages) for r in server.requests] == [5, 4]  # the rest, together
    else:
        assert [len(r.messages) for r in server.requests] == [5, 1, 1, 1, 1, 1]


def test_postmark_splits_a_batch_answer_per_message(esp: Make) -> None:
    provider, server = esp("postmark")
    recipients = ["a@example.com", "inactive@example.com", "bad@example.com", "d@example.com"]
    outcomes = send(provider, [row(n, r) for n, r in enumerate(recipients, 1)])
    assert len(server.requests) == 1
    assert server.requests[0].path == "/email/batch"
    assert isinstance(outcomes[0], Sent)
    assert isinstance(outcomes[3], Sent)
    assert outcomes[0] != outcomes[3]  # each its own MessageID
    assert isinstance(outcomes[1], Permanent)
    assert outcomes[1].suppress
    assert isinstance(outcomes[2], Permanent)
    assert not outcomes[2].suppress


def test_a_short_batch_answer_is_still_accepted_for_every_row(esp: Make) -> None:
    provider, server = esp("postmark")
    server.answers.append((200, JSON, b'[{"ErrorCode": 0, "MessageID": "m1"}]'))
    outcomes = send(provider, [row(1), row(2), row(3)])
    assert outcomes == [Sent("m1"), Sent(None), Sent(None)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("status", [429, 500, 503])
def test_a_refused_request_is_every_rows_retry(esp: Make, kind: str, status: int) -> None:
    provider, server = esp(kind)
    server.answers.append((status, {"Retry-After": "3"}, b"{}"))
    outcomes = send(provider, [row(n) for n in range(1, 5)])
    assert len(server.requests) == 1
    assert all(isinstance(o, Retry) and o.retry_after == 3.0 for o in outcomes)
    assert all(o.throttled == (status == 429) for o in outcomes if isinstance(o, Retry))


@pytest.mark.parametrize("kind", KINDS)
def test_requests_stay_within_the_apis_limits(esp: Make, kind: str) -> None:
    provider, server = esp(kind)
    count = provider.max_batch + 2
    rows = [row(n) for n in range(1, count + 1)] + [row(count + 1, "user1@example.com")]
    outcomes = send(provider, rows)
    assert all(isinstance(o, Sent) for o in outcomes)
    # the repeated address waits for the second request: none carries one twice
    assert sorted(len(r.messages) for r in server.requests) == [3, provider.max_batch]


def test_a_mailgun_row_holding_a_recipient_variable_is_sent_alone(esp: Make) -> None:
    provider, server = esp("mailgun")
    rows = [row(1, body="Hi %recipient.name%"), row(2, body="Hi %recipient.name%"), row(3)]
    assert all(isinstance(o, Sent) for o in send(provider, rows))
    assert len(server.requests) == 3
    assert server.messages[0]["text"] == "Hi %recipient.name%"


# -- any answer at all ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    status=st.sampled_from([200, 202, 204, 301, 400, 401, 404, 413, 422, 429, 500, 502]),
    body=st.one_of(
        st.binary(max_size=300),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
            lambda inner: (
                st.lists(inner, max_size=4)
                | st.dictionaries(
                    st.sampled_from(
                        [
                            "ErrorCode",
                            "Message",
                            "MessageID",
                            "id",
                            "message",
                            "errors",
                            "field",
                            "To",
                        ]
                    ),
                    inner,
                    max_size=4,
                )
            ),
            max_leaves=12,
        ).map(lambda doc: json.dumps(doc).encode()),
    ),
    retry=st.one_of(
        st.none(), st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=30)
    ),
    size=st.integers(1, 4),
)
def test_any_answer_gives_one_outcome_per_row(
    esp: Make, kind: str, status: int, body: bytes, retry: str | None, size: int
) -> None:
    provider, server = esp(kind)
    server.answers[:] = [
        (status, {"Retry-After": retry} if retry and retry.isprintable() else {}, body)
    ] * 20
    outcomes = send(provider, [row(n) for n in range(1, size + 1)])
    assert len(outcomes) == size
    assert all(isinstance(o, Sent | Retry | Permanent) for o in outcomes)
    for o in outcomes:
        if isinstance(o, Retry) and o.retry_after is not None:
            assert 0 <= o.retry_after <= 86_400
