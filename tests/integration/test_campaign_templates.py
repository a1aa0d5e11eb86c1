"""Campaigns that name a stored Jinja2 template: each recipient's message is rendered at send
time from their own fields and code, through the real dispatcher and a real SMTP server."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from notifier.campaigns import CampaignError, Campaigns
from notifier.db.templates import upsert_template
from notifier.delivery.dispatcher import Dispatcher
from notifier.providers import registry_of
from notifier.providers.email import EmailProvider
from notifier.settings import Settings, get_settings
from tests.smtp_sink import SmtpSink

AUDIENCE = "email,name\nann@example.com,Ann <3\nbob@example.com,Bob\ncy@example.com,Cy\n"


@pytest.fixture
def campaigns(engine: Engine) -> Campaigns:
    return Campaigns(engine)


@pytest.fixture
def dispatcher(engine: Engine, settings: Settings, smtp_sink: SmtpSink) -> Iterator[Dispatcher]:
    sender = Dispatcher(engine, registry_of([EmailProvider(get_settings())]), settings)
    yield sender
    sender.close()


def _store(engine: Engine, name: str = "gift", locale: str = "en", **parts: str) -> None:
    with engine.begin() as conn:
        upsert_template(
            conn,
            name,
            "email",
            locale,
            (parts.get("subject"), parts.get("body"), parts.get("html")),
        )


def _rows(engine: Engine, sql: str) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(text(sql))]


def test_each_recipient_gets_an_html_part_with_their_own_name_and_code(
    engine: Engine, campaigns: Campaigns, dispatcher: Dispatcher, smtp_sink: SmtpSink
) -> None:
    _store(
        engine,
        subject="A gift for you, {{ name }}",
        body="Hi {{ name }}, use {{ code }} at {{ shop }}.",
        html="<p>Hi {{ name }}, your code is <b>{{ code }}</b> ({{ campaign }})</p>",
    )
    campaigns.create("spring", "email", template="gift", payload={"shop": "the shop"})
    assert campaigns.import_audience("spring", io.StringIO(AUDIENCE), "email") == 3
    assert campaigns.import_codes("spring", ["K-ANN", "K-BOB", "K-CY"]) == 3
    assert campaigns.launch("spring") == 3
    assert _rows(
        engine,
        "SELECT recipient, template, locale, subject, body, payload->>'name',"
        " payload->>'recipient', payload->>'campaign' FROM notifications ORDER BY recipient",
    ) == [
        ("ann@example.com", "gift", None, None, None, "Ann <3", "ann@example.com", "spring"),
        ("bob@example.com", "gift", None, None, None, "Bob", "bob@example.com", "spring"),
        ("cy@example.com", "gift", None, None, None, "Cy", "cy@example.com", "spring"),
    ]

    while dispatcher.run_once().claimed:
        pass

    assert _rows(engine, "SELECT DISTINCT status FROM notifications") == [("sent",)]
    expected = {
        "ann@example.com": ("Ann <3", "Ann &lt;3", "K-ANN"),
        "bob@example.com": ("Bob", "Bob", "K-BOB"),
        "cy@example.com": ("Cy", "Cy", "K-CY"),
    }
    assert sorted(a for m in smtp_sink.messages for a in m.rcpt_tos) == sorted(expected)
    for address, (name, escaped, code) in expected.items():
        [received] = smtp_sink.delivered_to(address)
        message = received.message
        html = message.get_body(("html",))
        plain = message.get_body(("plain",))
        assert html is not None
        assert plain is not None
        assert message["Subject"] == f"A gift for you, {name}"
        assert html.get_content().strip() == (
            f"<p>Hi {escaped}, your code is <b>{code}</b> (spring)</p>"
        )
        assert plain.get_content().strip() == f"Hi {name}, use {code} at the shop."
    assert campaigns.status("spring").campaign.status == "finished"


def test_a_field_the_template_uses_that_a_recipient_lacks_stops_the_launch(
    engine: Engine, campaigns: Campaigns
) -> None:
    _store(engine, subject="Hi {{ name }}", html="<p>{% if vip %}{{ first_name }}{% endif %}</p>")
    campaigns.create("spring", "email", template="gift")
    campaigns.import_audience("spring", io.StringIO(AUDIENCE), "email")
    with pytest.raises(CampaignError) as refused:
        campaigns.launch("spring")
    assert str(refused.value) == (
        "recipient 'ann@example.com' has no value for 'first_name', 'vip', which the template"
        " uses (its fields: first_name, name, vip); fix the audience and launch again"
    )
    assert _rows(engine, "SELECT count(*) FROM notifications") == [(0,)]
    assert _rows(engine, "SELECT count(*) FROM campaign_chunks") == [(0,)]


def test_the_template_checked_is_the_one_the_rows_will_find(
    engine: Engine, campaigns: Campaigns
) -> None:
    """The campaign's locale falls back as a row's does: de-AT, de, then the default locale;
    only that version's variables must be in the audience."""
    _store(engine, locale="en", body="Hello {{ name }} {{ nickname }}")
    _store(engine, locale="de", body="Hallo {{ name }}, dein Code: {{ code }}")
    campaigns.create("herbst", "email", template="gift", locale="de_at")
    campaigns.import_audience("herbst", io.StringIO(AUDIENCE), "email")
    with pytest.raises(CampaignError, match="3 recipients still need a code"):
        campaigns.launch("herbst")
    campaigns.generate_codes("herbst", 3)
    assert campaigns.launch("herbst") == 3
    assert _rows(engine, "SELECT DISTINCT template, locale FROM notifications") == [
        ("gift", "de-AT")
    ]


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        (
            {"template": "nope"},
            "no stored template 'nope' for channel email in locale en; add it first",
        ),
        (
            {"template": "gift", "locale": "fr-CA"},
            "no stored template 'gift' for channel email in locale fr-CA or fr or en",
        ),
        (
            {"template": "gift", "body": "Hi {name}"},
            "a campaign takes a stored template or a subject and body, not both",
        ),
        ({"locale": "de", "body": "Hi"}, "a locale goes with a stored template"),
        ({"template": "gift", "locale": "d e"}, "is not a locale like en, de or de-AT"),
    ],
)
def test_create_refuses_a_template_it_cannot_use(
    engine: Engine, campaigns: Campaigns, arguments: dict[str, str], error: str
) -> None:
    _store(engine, locale="de", body="Hallo")
    with pytest.raises(CampaignError, match=error):
        campaigns.create("spring", "email", **arguments)
    assert _rows(engine, "SELECT count(*) FROM campaigns") == [(0,)]


def test_a_template_removed_or_broken_after_create_stops_the_launch(
    engine: Engine, campaigns: Campaigns
) -> None:
    _store(engine, body="Hi {{ name }}")
    campaigns.create("spring", "email", template="gift")
    campaigns.import_audience("spring", io.StringIO(AUDIENCE), "email")
    with engine.begin() as conn:  # written behind notifier template add's back
        conn.execute(text("UPDATE templates SET body = 'Hi {{ name'"))
    with pytest.raises(CampaignError, match=r"template 'gift' \(email, en\) does not compile"):
        campaigns.launch("spring")
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM templates"))
    with pytest.raises(CampaignError, match="no stored template 'gift'"):
        campaigns.launch("spring")
    assert _rows(engine, "SELECT count(*) FROM notifications") == [(0,)]
