"""Bad rows refused at the door with the worker's own reason: ``notifier.enqueue`` and
``notifier send`` write nothing for a row a worker would give up, and say why in the words of
the ``last_error`` the real dispatcher records for the same row. Real PostgreSQL throughout."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import hypothesis
import psycopg
import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st
from sqlalchemy import Engine, text

import notifier
from notifier.db import producers
from notifier.db.templates import TemplateRow, upsert_template
from notifier.delivery import guards
from notifier.delivery.dispatcher import Dispatcher
from notifier.delivery.intake import Intake, would_be
from notifier.providers import load_registry
from notifier.settings import Settings
from tests.commands import run
from tests.factories import MakeRow, MakeSettings

pytestmark = pytest.mark.usefixtures("restore_logging")

NOT_EMAIL = (
    "invalid notification: recipient 'not-an-email' is not a plain ASCII email address like"
    " 'ada@example.com' (give an internationalised domain in punycode)"
)


def _deep(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


# Each a row no worker can send: (what it is, its columns as a producer writes them).
BAD_ROWS: list[tuple[str, dict[str, Any]]] = [
    ("email not an address", {"channel": "email", "recipient": "not-an-email", "subject": "s"}),
    ("email domain", {"channel": "email", "recipient": "a@b..example", "subject": "s"}),
    ("email lists two", {"channel": "email", "recipient": "a@x.org,b@x.org", "subject": "s"}),
    ("email subject", {"channel": "email", "recipient": "a@x.org", "subject": "s" * 999}),
    (
        "email html",
        {"channel": "email", "recipient": "a@x.org", "subject": "s", "payload": {"html": 1}},
    ),
    ("sms not E.164", {"channel": "sms", "recipient": "0155512345", "body": "hi"}),
    ("sms no body", {"channel": "sms", "recipient": "+14155550100"}),
    ("webhook ftp", {"channel": "webhook", "recipient": "ftp://example.com/x"}),
    ("webhook http", {"channel": "webhook", "recipient": "http://example.com/x"}),
    ("webhook loopback", {"channel": "webhook", "recipient": "https://127.0.0.1/x"}),
    ("webhook host", {"channel": "webhook", "recipient": "https://a_-.example/x"}),
    ("push data", {"channel": "push", "recipient": "tok", "body": "b", "payload": {"n": 1}}),
    ("push empty", {"channel": "push", "recipient": "tok"}),
    ("unknown channel", {"channel": "fax", "recipient": "x"}),
    ("no template", {"channel": "email", "recipient": "a@x.org", "template": "nope"}),
    (
        "template locale",
        {"channel": "email", "recipient": "a@x.org", "template": "hello", "locale": "??"},
    ),
    (
        "template variable",
        {"channel": "email", "recipient": "a@x.org", "template": "hello", "payload": {}},
    ),
    (
        "rendered sms empty",
        {"channel": "sms", "recipient": "+14155550100", "template": "text", "payload": {"t": " "}},
    ),
    ("unknown guard", {"channel": "null", "recipient": "x", "guard": "nope"}),
    ("payload size", {"channel": "null", "recipient": "x", "payload": {"b": "x" * 2000}}),
    ("payload depth", {"channel": "null", "recipient": "x", "payload": {"d": _deep(70)}}),
    ("recipient length", {"channel": "null", "recipient": "r" * 2049}),
    ("subject length", {"channel": "null", "recipient": "x", "subject": "s" * 2049}),
]


@pytest.fixture
def settings(make_settings: MakeSettings) -> Settings:
    return make_settings(max_payload_bytes=1024)


@pytest.fixture
def templates(engine: Engine) -> None:
    with engine.begin() as conn:
        upsert_template(conn, "hello", "email", "en", ("Hi {{ name }}", "b", None))
        upsert_template(conn, "text", "sms", "en", (None, "{{ t }}", None))


def _reader(engine: Engine) -> Any:
    def read(name: str, channel: str) -> Iterable[TemplateRow]:
        with engine.connect() as conn:
            return producers.templates_of(conn, name, channel)

    return read


@pytest.mark.usefixtures("templates")
def test_the_reason_at_the_door_is_the_last_error_the_worker_records(
    engine: Engine, settings: Settings, make_row: MakeRow
) -> None:
    intake = Intake(settings)
    expected: dict[int, str | None] = {}
    for name, row in BAD_ROWS:
        fields = {k: v for k, v in row.items() if k != "recipient"}
        reason = intake.refusal(would_be(recipient=row["recipient"], **fields), _reader(engine))
        assert reason is not None, name
        expected[make_row(dedupe_key=name, **row)] = reason
    dispatcher = Dispatcher(
        engine, load_registry(settings), settings, guards=guards.load_registry(settings)
    )
    try:
        dispatcher.run_once()
    finally:
        dispatcher.close()
    with engine.connect() as conn:
        found = conn.execute(text("SELECT id, last_error FROM notifications WHERE status = 'dead'"))
        recorded = {int(row_id): error for row_id, error in found}
    assert recorded == expected


@pytest.mark.usefixtures("templates")
def test_good_rows_pass_the_door(engine: Engine, settings: Settings) -> None:
    intake = Intake(settings)
    good = [
        would_be(channel="email", recipient="ann@example.com", subject="Hi", body="b"),
        would_be(channel="sms", recipient="+14155550100", body="hi"),
        would_be(channel="webhook", recipient="https://example.com/hook", payload={"a": [1]}),
        would_be(channel="push", recipient="tok", subject="Hi", payload={"k": "v"}),
        would_be(channel="email", recipient="a@x.org", template="hello", payload={"name": "A"}),
        would_be(channel="null", recipient="x", guard="http", dedupe_key="k" * 1000),
    ]
    assert [intake.refusal(n, _reader(engine)) for n in good] == [None] * len(good)


def _count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM notifications")).scalar_one())


@pytest.mark.usefixtures("templates")
@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"channel": "email", "to": "not-an-email", "subject": "s"}, NOT_EMAIL),
        (
            {"channel": "sms", "to": "0155512345", "body": "hi"},
            "invalid notification: recipient '0155512345' is not an E.164 phone number like"
            " +14155550100 ('+', country code, number; digits only, no spaces or dashes)",
        ),
        (
            {"channel": "webhook", "to": "ftp://example.com/x"},
            "invalid notification: recipient URL scheme 'ftp' is not supported; use https",
        ),
        (
            {"channel": "email", "to": "a@x.org", "template": "nope"},
            "no template 'nope' for channel email in locale en",
        ),
        (
            {"channel": "email", "to": "a@x.org", "template": "hello", "locale": "de-AT"},
            "template 'hello' needs 'name', which the payload lacks",
        ),
        (
            {"channel": "null", "to": "x", "subject": "a\x00b"},
            "subject holds a NUL character, which PostgreSQL cannot store; remove it",
        ),
        (
            {"channel": "null", "to": "x", "body": "a\ud800"},
            "body is not valid Unicode text (a lone surrogate at character 1), which PostgreSQL"
            " cannot store",
        ),
        (
            {"channel": "null", "to": "x", "payload": {"a": "\x00"}},
            "payload holds a NUL character (\\u0000), which PostgreSQL cannot store; remove it",
        ),
        (
            {"channel": "null", "to": "x", "payload": {"a": float("nan")}},
            "invalid notification: payload is not JSON-serializable: Out of range float values"
            " are not JSON compliant",
        ),
        (
            {"channel": "null", "to": "x", "payload": {"a": object()}},
            "invalid notification: payload is not JSON-serializable: Object of type object is"
            " not JSON serializable",
        ),
        (
            {"channel": "null", "to": "x", "key": "é" * 513},
            "dedupe key is 1026 bytes; at most 1000 allowed: use a shorter key, or a hash of a"
            " long one",
        ),
    ],
)
def test_enqueue_refuses_with_the_reason_and_writes_nothing(
    engine: Engine, kwargs: dict[str, Any], reason: str
) -> None:
    with engine.begin() as conn:
        kept = notifier.enqueue(conn, channel="null", to="x", key="before")
        with pytest.raises(ValueError) as refused:
            notifier.enqueue(conn, **kwargs)
        assert str(refused.value) == reason
    # the caller's transaction went on and committed what it wrote before
    with engine.connect() as conn:
        ids = conn.execute(text("SELECT id FROM notifications")).scalars().all()
    assert ids == [kept.id]


@pytest.mark.usefixtures("templates")
def test_enqueue_on_a_psycopg_connection_reads_the_template_and_refuses(
    engine: Engine, database_url: str
) -> None:
    dsn = database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn) as conn:
        with pytest.raises(ValueError, match=r"^template 'hello' needs 'name'"):
            notifier.enqueue(conn, channel="email", to="a@x.org", template="hello")
        with pytest.raises(ValueError, match=r"^invalid notification: recipient 'not-an-email'"):
            notifier.enqueue(conn, channel="email", to="not-an-email", subject="s")
        notifier.enqueue(conn, channel="email", to="a@x.org", template="hello", payload={"name": 1})
    assert _count(engine) == 1


@pytest.mark.usefixtures("templates")
@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--channel", "email", "--to", "not-an-email", "--subject", "s"], NOT_EMAIL),
        (
            ["--channel", "sms", "--to", "0155512345", "--body", "hi"],
            "invalid notification: recipient '0155512345' is not an E.164 phone number",
        ),
        (
            ["--channel", "webhook", "--to", "ftp://example.com/x"],
            "invalid notification: recipient URL scheme 'ftp' is not supported; use https",
        ),
        (
            ["--channel", "email", "--to", "a@x.org", "--template", "nope"],
            "no template 'nope' for channel email in locale en",
        ),
        (
            ["--channel", "null", "--to", "x", "--guard", "nope"],
            "unknown guard 'nope'; this deployment has: http",
        ),
    ],
)
def test_send_refuses_bad_input_with_one_line_and_status_2(
    capsys: pytest.CaptureFixture[str], engine: Engine, argv: list[str], said: str
) -> None:
    code, out, err = run(capsys, "send", *argv)
    assert (code, out) == (2, "")
    assert err.startswith(f"notifier: {said}")
    assert err.count("\n") == 1
    assert _count(engine) == 0


def test_send_of_a_good_row_still_prints_its_id(
    capsys: pytest.CaptureFixture[str], engine: Engine
) -> None:
    code, out, _ = run(capsys, "send", "--channel", "email", "--to", "ann@example.com")
    assert code == 0
    assert out.strip().isdigit()
    assert _count(engine) == 1


TEXT = st.text(st.characters(codec=None), max_size=40) | st.sampled_from(
    ["a@x.org", "+14155550100", "https://example.com/h", "tok", "\x00", "\ud800", "é" * 600]
)


@hypothesis.settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    channel=st.sampled_from(["null", "email", "sms", "push", "webhook", "fax"]),
    to=TEXT,
    subject=st.none() | TEXT,
    body=st.none() | TEXT,
    key=st.none() | TEXT,
    payload=st.dictionaries(TEXT, TEXT | st.integers() | st.floats(), max_size=3),
    template=st.none() | st.sampled_from(["hello", "text", "nope"]),
)
@pytest.mark.usefixtures("templates")
def test_whatever_a_producer_passes_enqueue_writes_it_or_refuses_with_one_line(
    engine: Engine,
    channel: str,
    to: str,
    subject: str | None,
    body: str | None,
    key: str | None,
    payload: dict[str, Any],
    template: str | None,
) -> None:
    with engine.connect() as conn, conn.begin():
        try:
            notifier.enqueue(
                conn,
                channel=channel,
                to=to,
                subject=subject,
                body=body,
                key=key,
                payload=payload,
                template=template,
            )
        except ValueError as exc:
            said = str(exc)
            assert said
            assert said.isprintable()
        conn.rollback()
