"""Templates, the suppression list and overrides against real PostgreSQL and a real SMTP server.

``Content`` is driven directly; the last test runs the whole ``Dispatcher`` once dispatch calls
``Content`` (until then it is an expected failure).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from sqlalchemy import Connection, Engine, text

from notifier.cli.main import cli
from notifier.db import make_engine
from notifier.db.suppressions import suppress_many
from notifier.db.templates import upsert_template
from notifier.delivery.dispatcher import Dispatcher
from notifier.delivery.outcomes import Attempt, Cancelled, Result, plan
from notifier.delivery.prepare import Content
from notifier.delivery.retry import RetryPolicy
from notifier.models import Notification
from notifier.providers import registry_of
from notifier.providers.base import Permanent, Retry, Sent
from notifier.providers.email import EmailProvider
from notifier.providers.null import NullProvider
from notifier.settings import Settings, get_settings
from tests.factories import MakeRow
from tests.smtp_sink import SmtpSink
from tests.turn_proxy import counting

ANN = "ann@example.com"
GONE = "gone@example.com"


def suppress_refused(
    conn: Connection, content: Content, rows: list[Notification], results: dict[int, Result]
) -> int:
    """Write the suppressions that the decisions made of ``results`` carry, as the recorder
    does with a batch's outcomes; how many were new."""
    sends = {i: Attempt(result) for i, result in results.items()}
    now = datetime.now(UTC)
    decided = plan(rows, sends, RetryPolicy(), now, overrides=content.overrides)
    return suppress_many(conn, [d.suppress for d in decided.decisions if d.suppress])


def note(id: int = 1, recipient: str = ANN, **fields: Any) -> Notification:
    values: dict[str, Any] = {
        "id": id,
        "channel": "email",
        "recipient": recipient,
        "subject": None,
        "body": None,
        "payload": {},
        "attempts": 1,
        "max_attempts": 5,
        "claim_token": uuid4(),
        "created_at": datetime.now(UTC),
    }
    values.update(fields)
    return Notification(**values)


def add_template(engine: Engine, locale: str = "en", channel: str = "email", **parts: str) -> None:
    with engine.begin() as conn:
        upsert_template(
            conn,
            parts.pop("name", "welcome"),
            channel,
            locale,
            (parts.get("subject"), parts.get("body"), parts.get("html")),
        )


def sql(engine: Engine, statement: str, **params: object) -> list[tuple[Any, ...]]:
    with engine.begin() as conn:
        result = conn.execute(text(statement), params)
        return [tuple(r) for r in result.all()] if result.returns_rows else []


@pytest.fixture
def email(smtp_sink: SmtpSink) -> Iterator[EmailProvider]:
    provider = EmailProvider(get_settings())
    yield provider
    provider.close()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# -- templates ----------------------------------------------------------------------------------


def test_a_templated_row_is_rendered_in_its_language_and_sent(
    engine: Engine, settings: Settings, email: EmailProvider, smtp_sink: SmtpSink
) -> None:
    add_template(engine, "en", subject="Welcome, {{ first_name }}", body="Hello {{ first_name }}")
    add_template(
        engine,
        "de",
        subject="Willkommen, {{ first_name }}",
        body="Hallo {{ first_name }}, dein Code: {{ code }}",
        html="<p>Hallo {{ first_name }}, dein Code: <b>{{ code }}</b></p>",
    )
    payload = {"first_name": "Ann <3", "code": "{{ 7*7 }}"}
    row = note(template="welcome", locale="de-AT", payload=payload)

    ready, results = Content(engine, settings).prepare([row])

    assert results == {}
    assert email.send(ready[0]) == Sent("<notification-1@localhost>")
    [message] = smtp_sink.delivered_to(ANN)
    assert message.message["Subject"] == "Willkommen, Ann <3"
    text_part = message.message.get_body(("plain",))
    html_part = message.message.get_body(("html",))
    assert text_part is not None
    assert html_part is not None
    assert text_part.get_content().strip() == "Hallo Ann <3, dein Code: {{ 7*7 }}"
    assert html_part.get_content().strip() == (
        "<p>Hallo Ann &lt;3, dein Code: <b>{{ 7*7 }}</b></p>"
    )


def test_no_template_in_any_locale_of_the_chain_is_permanent(
    engine: Engine, settings: Settings
) -> None:
    add_template(engine, "fr", body="Bonjour")
    add_template(engine, "en", channel="sms", body="Hello")
    rows = [
        note(1, template="welcome", locale="de-AT"),
        note(2, template="welcome", locale="fr-CA"),
        note(3, template="welcome"),
        note(4, template="welcome", locale="de AT"),
    ]

    ready, results = Content(engine, settings).prepare(rows)

    assert [(n.id, n.body) for n in ready] == [(2, "Bonjour")]
    assert results == {
        1: Permanent("no template 'welcome' for channel email in locale de-AT, de or en"),
        3: Permanent("no template 'welcome' for channel email in locale en"),
        4: Permanent("invalid notification: locale: 'de AT' is not a locale like en, de or de-AT"),
    }


def test_a_missing_variable_or_a_broken_template_makes_the_row_dead(
    engine: Engine, settings: Settings
) -> None:
    add_template(engine, subject="Welcome, {{ first_name }}", body="Hi")
    # Written behind ``template add``'s back, which would have refused it.
    sql(
        engine,
        "INSERT INTO templates (name, channel, locale, body) VALUES ('b', 'email', 'en',"
        " 'Hello {% if %}')",
    )
    rows = [
        note(1, template="welcome", payload={"name": "Ann"}),
        note(2, template="b"),
        note(3, template="welcome", payload={"first_name": "Ann"}),
    ]

    ready, results = Content(engine, settings).prepare(rows)

    assert [n.id for n in ready] == [3]
    assert results[1] == Permanent("template 'welcome' needs 'first_name', which the payload lacks")
    error = results[2]
    assert isinstance(error, Permanent)
    assert error.error.startswith("template 'b' (email, en) does not compile: body line 1:")


def test_templates_are_cached_and_read_again_after_the_cache_period(
    engine: Engine, settings: Settings
) -> None:
    clock = Clock()
    content = Content(engine, settings, cache_seconds=30, clock=clock)
    row = note(template="welcome")
    _, results = content.prepare([row])
    assert isinstance(results[1], Permanent)

    add_template(engine, body="first")  # added a moment after a row found none: found now
    assert content.prepare([row])[0][0].body == "first"

    add_template(engine, body="second")
    clock.now += 29
    assert content.prepare([row])[0][0].body == "first"
    clock.now += 1
    assert content.prepare([row])[0][0].body == "second"

    add_template(engine, "de", body="zweite")  # a more specific locale waits for the period too
    assert content.prepare([note(template="welcome", locale="de")])[0][0].body == "second"
    clock.now += 30
    assert content.prepare([note(template="welcome", locale="de")])[0][0].body == "zweite"


def test_a_batch_costs_one_query_for_suppressions_and_one_for_templates(
    engine: Engine, settings: Settings, database_url: str
) -> None:
    """Counted on the wire: each statement in autocommit, on a connection that is not pinged,
    is one round trip."""
    for name in ("a", "b", "c"):
        for locale in ("en", "de", "fr"):
            add_template(engine, locale, name=name, subject=f"{name} {locale} {{{{ n }}}}")
    suppress_by_sql(engine, "email", "u7@example.com", "unsubscribed")
    rows = [
        note(
            i,
            f"u{i}@example.com",
            template="abc"[i % 3],
            locale=["de-AT", "fr", None, "it"][i % 4],
            payload={"n": i},
        )
        for i in range(300)
    ]
    plain = [note(i, f"p{i}@example.com") for i in range(300, 600)]
    with counting(database_url) as (url, turns):
        through = make_engine(url, ping=False)
        content = Content(through, settings)
        try:
            with through.connect() as conn:
                conn.execution_options(isolation_level="AUTOCOMMIT")
                conn.execute(text("SELECT 1"))  # the connection's start-up
                turns.reset()
                ready, results = content.prepare(rows, conn)
                assert turns.count() == 2, turns.said()
                assert len(ready) == 299
                assert results == {7: Cancelled("suppressed: unsubscribed")}
                assert [n.subject for n in ready[:3]] == ["a de 0", "b fr 1", "c en 2"]

                content.prepare(rows, conn)  # every template cached
                assert turns.count() == 3

                ready, results = content.prepare(plain, conn)
                assert turns.count() == 4
                assert ready is plain
                assert results == {}

                stopped = {("email", "u7@example.com", None): "unsubscribed"}
                _, results = content.prepare(rows, conn, stopped)  # read with the first look
                assert turns.count() == 4
                assert results == {7: Cancelled("suppressed: unsubscribed")}
        finally:
            through.dispose()


def suppress_by_sql(engine: Engine, channel: str, recipient: str, reason: str) -> None:
    """The way a producer suppresses: plain SQL."""
    sql(
        engine,
        "INSERT INTO suppressions (channel, recipient, reason) VALUES (:c, :r, :why)"
        " ON CONFLICT DO NOTHING",
        c=channel,
        r=recipient,
        why=reason,
    )


# -- suppressions -------------------------------------------------------------------------------


def test_suppressed_rows_are_cancelled_and_others_pass_untouched(
    engine: Engine, settings: Settings
) -> None:
    suppress_by_sql(engine, "email", ANN, "unsubscribed")
    suppress_by_sql(engine, "sms", "+14155550100", "STOP")
    rows = [
        note(1, ANN),
        note(2, "bob@example.com"),
        note(3, "+14155550100", channel="sms"),
        note(4, ANN, channel="webhook"),  # suppressed on email only
    ]

    ready, results = Content(engine, settings).prepare(rows)  # on a connection of its own

    assert ready == [rows[1], rows[3]]
    assert ready[0] is rows[1]
    assert results == {1: Cancelled("suppressed: unsubscribed"), 3: Cancelled("suppressed: STOP")}


def test_a_hard_bounce_suppresses_the_recipient_once(
    engine: Engine, settings: Settings, email: EmailProvider, smtp_sink: SmtpSink
) -> None:
    smtp_sink.rcpt_replies[GONE] = "550 5.1.1 <gone@example.com>: no such user"
    content = Content(engine, settings)
    rows = [note(1, GONE, subject="hi"), note(2, ANN, subject="hi")]
    results = {n.id: email.send(n) for n in rows}
    assert results[1] == Permanent("SMTP 550 5.1.1 <gone@example.com>: no such user", suppress=True)

    with engine.begin() as conn:
        assert suppress_refused(conn, content, rows, results) == 1
        assert suppress_refused(conn, content, rows, results) == 0  # already there

    ready, later = content.prepare([note(3, GONE), note(4, ANN)])
    assert [n.id for n in ready] == [4]
    assert later == {
        3: Cancelled("suppressed: hard bounce (SMTP 550 5.1.1 <gone@example.com>: no such user)")
    }


@pytest.mark.parametrize(
    ("rcpt_reply", "data_reply", "suppress"),
    [
        pytest.param("550 5.1.1 no such user", None, True, id="550-5.1.1"),
        pytest.param("551 5.1.6 user has moved", None, True, id="551-5.1.6"),
        pytest.param("553 5.1.3 bad address syntax", None, True, id="553-5.1.3"),
        pytest.param("550 5.1.10 null MX", None, True, id="550-5.1.10"),
        pytest.param("550 no such user here", None, True, id="550-no-enhanced"),
        pytest.param("553 mailbox name not allowed", None, True, id="553-no-enhanced"),
        pytest.param("550 5.7.1 relaying denied", None, False, id="550-5.7.1-policy"),
        pytest.param("553 5.1.8 sender domain not found", None, False, id="553-5.1.8-sender"),
        pytest.param("552 5.2.2 mailbox full", None, False, id="552-5.2.2-full"),
        pytest.param("554 no thanks", None, False, id="554-no-enhanced"),
        pytest.param(None, "550 5.1.1 no such user", False, id="at-data"),
        pytest.param("451 4.1.1 try later", None, None, id="4xx"),
    ],
)
def test_only_a_refused_mailbox_is_suppressed(
    email: EmailProvider,
    smtp_sink: SmtpSink,
    rcpt_reply: str | None,
    data_reply: str | None,
    suppress: bool | None,
) -> None:
    if rcpt_reply is not None:
        smtp_sink.rcpt_replies[ANN] = rcpt_reply
    smtp_sink.data_reply = data_reply

    outcome = email.send(note(subject="hi"))

    if suppress is None:
        assert isinstance(outcome, Retry)
    else:
        assert isinstance(outcome, Permanent)
        assert outcome.suppress is suppress


# -- overrides ----------------------------------------------------------------------------------


def test_an_override_sends_to_the_override_and_suppresses_what_bounced(
    engine: Engine, database_url: str, email: EmailProvider, smtp_sink: SmtpSink
) -> None:
    settings = Settings(database_url=database_url, override_recipients="email=qa@example.com")
    content = Content(engine, settings)
    add_template(engine, body="Hi {{ recipient }}")
    row = note(1, ANN, subject="hi", template="welcome")

    [ready], _ = content.prepare([row])

    assert ready.recipient == "qa@example.com"
    assert ready.payload == {"original_recipient": ANN}
    assert ready.body == f"Hi {ANN}"  # rendered for the real recipient
    assert isinstance(email.send(ready), Sent)
    assert smtp_sink.rcpt_addresses() == ["qa@example.com"]

    # The address that refused is the one suppressed, not the row's.
    bounced = {1: Permanent("SMTP 550 5.1.1 no such user", suppress=True)}
    with engine.begin() as conn:
        assert suppress_refused(conn, content, [row], bounced) == 1
    assert sql(engine, "SELECT channel, recipient FROM suppressions") == [
        ("email", "qa@example.com")
    ]


# -- the commands -------------------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """``notifier ARGV`` in this process, errors raised; the logging it sets up undone."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        status = cli.main(list(argv), prog_name="notifier", standalone_mode=False)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    return status, capsys.readouterr().out


def test_template_commands(
    engine: Engine, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    html = tmp_path / "welcome.html"
    html.write_text("<p>Hi {{ first_name }}</p>\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"template 'welcome' not saved: body line 1: "):
        run(capsys, "template", "add", "welcome", "--channel", "email", "--body", "{{ x ")
    assert sql(engine, "SELECT count(*) FROM templates") == [(0,)]

    add = ("template", "add", "welcome", "--channel", "email", "--subject", "Hi {{ first_name }}")
    assert run(capsys, *add, "--html-file", str(html)) == (
        0,
        "template 'welcome' (email, en) added\n",
    )
    assert run(capsys, *add, "--locale", "de_at", "--body", "Hallo") == (
        0,
        "template 'welcome' (email, de-AT) added\n",
    )
    assert run(capsys, *add, "--locale", "de-AT", "--body", "Servus")[1].endswith("replaced\n")

    status, out = run(capsys, "template", "list")
    assert status == 0
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "CHANNEL", "LOCALE", "PARTS", "UPDATED"]
    assert lines[1].split()[:4] == ["welcome", "email", "de-AT", "subject,body"]
    assert lines[2].split()[:4] == ["welcome", "email", "en", "subject,html"]

    status, out = run(capsys, "template", "show", "welcome", "--locale", "de-at")
    assert status == 0
    assert "--- body\nServus\n" in out
    assert "--- html" not in out

    rm = ("template", "rm", "welcome", "--channel", "email", "--locale", "de-AT")
    assert run(capsys, *rm)[0] == 0
    assert run(capsys, *rm)[0] == 1
    assert run(capsys, "template", "show", "welcome", "--locale", "de-AT")[0] == 1


def test_suppress_commands(engine: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "suppress", "add", "--channel", "email", ANN, "--reason", "asked") == (
        0,
        f"suppressed email {ANN}\n",
    )
    status, out = run(capsys, "suppress", "add", "--channel", "email", ANN)
    assert status == 0
    assert "already suppressed since" in out
    assert out.endswith(": asked\n")
    run(capsys, "suppress", "add", "--channel", "sms", "+14155550100")

    status, out = run(capsys, "suppress", "list", "--channel", "email")
    assert status == 0
    assert [line.split()[-4:] for line in out.splitlines()[1:]] == [
        ["email", ANN, "operator", "asked"]
    ]
    assert len(run(capsys, "suppress", "list")[1].splitlines()) == 3

    assert run(capsys, "suppress", "rm", "--channel", "email", ANN)[0] == 0
    assert run(capsys, "suppress", "rm", "--channel", "email", ANN)[0] == 1
    assert sql(engine, "SELECT channel, reason FROM suppressions") == [("sms", "added by operator")]


# -- through the dispatcher ---------------------------------------------------------------------


def test_the_dispatcher_renders_suppresses_and_records_bounces(
    engine: Engine, settings: Settings, smtp_sink: SmtpSink, make_row: MakeRow
) -> None:
    add_template(engine, "de", subject="Willkommen, {{ first_name }}", body="Hallo!")
    suppress_by_sql(engine, "email", "bob@example.com", "unsubscribed")
    smtp_sink.rcpt_replies[GONE] = "550 5.1.1 no such user"
    welcome = {"channel": "email", "template": "welcome"}
    make_row(**welcome, recipient="ann@example.com", payload={"first_name": "Ann"}, locale="de-AT")
    make_row(channel="email", recipient="bob@example.com", subject="hi", body="hello")
    make_row(channel="email", recipient="gone@example.com", subject="hi", body="hello")
    make_row(**welcome, recipient="cy@example.com", locale="de")
    make_row(channel="null", recipient="x")
    dispatcher = Dispatcher(
        engine, registry_of([EmailProvider(get_settings()), NullProvider(Settings())]), settings
    )
    try:
        dispatcher.run_once()
        make_row(channel="email", recipient=GONE, subject="again")
        dispatcher.run_once()
    finally:
        dispatcher.close()

    assert sql(engine, "SELECT status, last_error FROM notifications ORDER BY id") == [
        ("sent", None),
        ("cancelled", "suppressed: unsubscribed"),
        ("dead", "SMTP 550 5.1.1 no such user"),
        ("dead", "template 'welcome' needs 'first_name', which the payload lacks"),
        ("sent", None),
        ("cancelled", "suppressed: hard bounce (SMTP 550 5.1.1 no such user)"),
    ]
    [message] = smtp_sink.messages
    assert message.message["Subject"] == "Willkommen, Ann"
    assert sql(engine, "SELECT recipient, reason FROM suppressions ORDER BY recipient") == [
        ("bob@example.com", "unsubscribed"),
        (GONE, "hard bounce (SMTP 550 5.1.1 no such user)"),
    ]
