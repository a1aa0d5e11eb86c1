"""The preference center against a real ``notifier events`` process and real PostgreSQL: what
the page shows, what saving writes, and what a forged, tampered or hostile request gets."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlencode

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from notifier import client, unsubscribe
from notifier.db import profiles
from notifier.db.templates import upsert_template
from notifier.delivery.prepare import Content, apply, compile_template
from notifier.models import Profile
from notifier.settings import Settings
from tests.events_endpoint import CENTER, PUBLIC, SECRET, Endpoint
from tests.integration.test_content import note

FORM = {"content-type": "application/x-www-form-urlencoded"}


def sql(engine: Engine, statement: str, **params: object) -> list[tuple[Any, ...]]:
    with engine.begin() as conn:
        result = conn.execute(text(statement), params)
        return [tuple(row) for row in result.all()] if result.returns_rows else []


def path_of(profile_id: str) -> str:
    return f"/p/{unsubscribe.preferences_token(SECRET, profile_id)}"


def boxes(page: str) -> dict[str, bool]:
    """Each enabled checkbox on the page by name: whether it is checked."""
    found = {}
    for tag in re.findall(r"<input type=\"checkbox\"[^>]*>", page):
        name = re.search(r'name="([^"]+)"', tag)
        if name:
            found[name.group(1)] = " checked" in tag
    return found


def test_the_page_shows_the_persons_choices_and_saving_writes_them_as_theirs(
    engine: Engine, endpoint: Endpoint
) -> None:
    with engine.begin() as conn:
        client.upsert_profile(conn, "u-7", email="ann@example.com", time_zone="Europe/Vienna")
        profiles.set_preferences(conn, "u-7", {("marketing", "sms"): False}, "producer")
    url = endpoint.url + path_of("u-7")

    shown = endpoint.client.get(url)

    assert shown.status_code == 200
    assert "ann@example.com" not in shown.text
    assert "u-7" not in shown.text
    # marketing on by default but off on SMS as recorded; digest off by default; security
    # (critical) shown checked and not editable.
    assert boxes(shown.text) == {"marketing/email": True, "marketing/sms": False,
                                 "digest/email": False}  # fmt: skip
    assert re.search(r"<input type=\"checkbox\" checked disabled", shown.text)
    assert "Always sent" in shown.text
    assert "(Europe/Vienna)" in shown.text
    csp = shown.headers["content-security-policy"]
    assert "default-src 'none'" in csp
    assert "script" not in csp
    assert shown.headers["referrer-policy"] == "no-referrer"
    assert shown.headers["cache-control"] == "no-store"

    form = {"marketing/sms": "on", "digest/email": "on", "quiet_start": "21:30",
            "quiet_end": "07:15"}  # fmt: skip
    saved = endpoint.client.post(url, content=urlencode(form), headers=FORM)

    assert saved.status_code == 200
    assert 'role="status"' in saved.text
    assert boxes(saved.text) == {"marketing/email": False, "marketing/sms": True,
                                 "digest/email": True}  # fmt: skip
    chosen = "SELECT category, channel, enabled, source FROM preferences ORDER BY 1, 2"
    assert sql(engine, chosen) == [
        ("digest", "email", True, "person"),
        ("marketing", "email", False, "person"),
        ("marketing", "sms", True, "person"),
    ]
    assert sql(engine, "SELECT quiet_start::text, quiet_end::text FROM profiles") == [
        ("21:30:00", "07:15:00")
    ]
    history = sql(engine, "SELECT category, channel, enabled, source FROM preference_history"
                          " ORDER BY id")  # fmt: skip
    assert history == [
        ("marketing", "sms", False, "producer"),
        ("marketing", "email", False, "person"),
        ("marketing", "sms", True, "person"),
        ("digest", "email", True, "person"),
    ]


def test_forged_tampered_or_foreign_tokens_and_stray_fields_change_nothing(
    engine: Engine, endpoint: Endpoint
) -> None:
    with engine.begin() as conn:
        client.upsert_profile(conn, "u", email="ann@example.com")
    good = path_of("u")
    tampered = good[:-2] + ("A" if good[-2] != "A" else "B") + good[-1]
    unsubscribing = "/p/" + unsubscribe.make_token(SECRET, "email", "ann@example.com", "")
    other = "/p/" + unsubscribe.preferences_token("another-secret", "u")
    for path in (tampered, unsubscribing, other, "/p/x", "/p/" + "A" * 5000):
        answer = endpoint.client.get(endpoint.url + path)
        assert answer.status_code == 403, path
        assert answer.headers["referrer-policy"] == "no-referrer"
    for form in ({"marketing/email": "on", "admin": "1"}, {"security/email": "on"},
                 {"marketing/email": "yes"}, {"quiet_start": "22:00"},
                 {"quiet_start": "25:00", "quiet_end": "07:00"}):  # fmt: skip
        answer = endpoint.client.post(endpoint.url + good, content=urlencode(form), headers=FORM)
        assert answer.status_code == 400, form
    assert sql(engine, "SELECT count(*) FROM preferences") == [(0,)]
    # A person deleted since: nothing to show, nothing written.
    sql(engine, "DELETE FROM profiles")
    gone = endpoint.client.post(endpoint.url + good, content="marketing%2Femail=on", headers=FORM)
    assert gone.status_code == 404
    assert sql(engine, "SELECT count(*) FROM preferences") == [(0,)]
    assert "/p/" + good[3:] not in endpoint.log.read_text()  # no token in the access log


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    body=st.binary(max_size=300)
    | st.dictionaries(st.text(max_size=30), st.text(max_size=30), max_size=6).map(
        lambda d: urlencode(d).encode()
    ),
    content_type=st.sampled_from(
        ["application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "text/plain", ""]
    ),
)
def test_no_form_body_gets_a_server_error(
    engine: Engine, endpoint: Endpoint, body: bytes, content_type: str
) -> None:
    sql(engine, "INSERT INTO profiles (id) VALUES ('h') ON CONFLICT DO NOTHING")
    answer = endpoint.client.post(
        endpoint.url + path_of("h"), content=body, headers={"content-type": content_type}
    )
    assert answer.status_code in (200, 400), answer.text


def test_a_template_links_each_person_to_their_own_center(
    engine: Engine, make_settings: Any
) -> None:
    settings: Settings = make_settings(
        events_public_url=PUBLIC, unsubscribe_secret=SECRET, preference_center=CENTER
    )
    content = Content(engine, settings)
    body = "Manage: {{ preferences_url }}"
    template = compile_template("news", "email", "en", "News", body, None)

    person = note(recipient="ann@example.com", template="news", profile=Profile("u-1"))
    rendered = apply(template, person, content.settings)
    assert not isinstance(rendered, str)
    link = (rendered.body or "").removeprefix("Manage: ")
    assert link.startswith(f"{PUBLIC}/p/")
    assert unsubscribe.read_preferences_token(SECRET, link.rsplit("/", 1)[1]) == "u-1"
    # A row of no person has no center: its template cannot use the link.
    assert apply(template, note(template="news"), content.settings) == (
        "template 'news' needs 'preferences_url', which the payload lacks"
    )


def test_the_page_speaks_the_persons_language_from_stored_templates(
    engine: Engine, endpoint: Endpoint
) -> None:
    with engine.begin() as conn:
        client.upsert_profile(conn, "de-1", locale="de-AT", fields={"first_name": "Anna"})
        upsert_template(conn, "preferences", "page", "de",
                        ("Ihre Einstellungen, {{ first_name }}", "Was wir senden <b>dürfen</b>.",
                         None))  # fmt: skip
        upsert_template(conn, "category.marketing", "page", "de", ("Angebote", None, None))

    page = endpoint.client.get(endpoint.url + path_of("de-1")).text

    assert '<html lang="de">' in page
    assert "<title>Ihre Einstellungen, Anna</title>" in page
    assert "Was wir senden &lt;b&gt;dürfen&lt;/b&gt;." in page  # escaped, not markup
    assert "<legend>Angebote</legend>" in page
    assert "<legend>Digest</legend>" in page  # no German text stored: the default
