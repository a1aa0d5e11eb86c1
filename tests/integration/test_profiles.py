"""Recipient profiles and preferences (migration 0022) against real PostgreSQL and a real SMTP
server: a row addressed to a person is sent to the address the profile holds when it is sent,
in the person's locale, with their fields, unless they turned its category off."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError

from notifier import client
from notifier.campaigns import CampaignError, Campaigns
from notifier.db import profiles
from notifier.db.templates import upsert_template
from notifier.delivery.dispatcher import Dispatcher
from notifier.providers import registry_of
from notifier.providers.email import EmailProvider
from notifier.providers.null import NullProvider
from notifier.settings import Settings, get_settings
from notifier.specs import PROFILE_PATTERN
from tests.commands import run
from tests.factories import MakeSettings
from tests.roles import Logins
from tests.smtp_sink import SmtpSink

BAD = "invalid notification: "


def sql(engine: Engine, statement: str, **params: object) -> list[tuple[Any, ...]]:
    with engine.begin() as conn:
        result = conn.execute(text(statement), params)
        return [tuple(row) for row in result.all()] if result.returns_rows else []


def dispatch(engine: Engine, settings: Settings) -> None:
    dispatcher = Dispatcher(
        engine, registry_of([EmailProvider(get_settings()), NullProvider(Settings())]), settings
    )
    try:
        dispatcher.run_once()
    finally:
        dispatcher.close()


@pytest.fixture
def login(engine: Engine, database_url: str) -> Iterator[Callable[[str], str]]:
    made = Logins(engine, database_url)
    yield lambda group: made.dsn(made.make(group))
    made.drop()


def test_a_waiting_row_goes_to_the_address_the_profile_holds_when_it_is_sent(
    engine: Engine, settings: Settings, smtp_sink: SmtpSink
) -> None:
    upsert = {"locale": "de-AT", "fields": {"first_name": "Ann"}}
    with engine.begin() as conn:
        client.upsert_profile(conn, "user-1", email="old@example.com", **upsert)
        upsert_template(conn, "welcome", "email", "de", ("Hallo {{ first_name }}", "!", None))
        client.enqueue(conn, channel="email", profile="user-1", template="welcome", key="w1")
    # The person changes their address while the row waits.
    with engine.begin() as conn:
        client.upsert_profile(conn, "user-1", email="new@example.com")
    assert sql(engine, "SELECT recipient, profile FROM notifications") == [("", "user-1")]

    dispatch(engine, settings)

    [message] = smtp_sink.messages
    assert message.rcpt_tos == ["new@example.com"]
    assert message.message["Subject"] == "Hallo Ann"
    assert sql(engine, "SELECT status, recipient FROM notifications") == [("sent", "")]
    with engine.connect() as conn:
        stored = profiles.get(conn, "user-1")
    assert stored is not None
    assert (stored.locale, stored.email) == ("de-AT", "new@example.com")


def test_rows_a_profile_cannot_take_end_with_a_reason_and_leave_the_rest(
    engine: Engine, settings: Settings, smtp_sink: SmtpSink
) -> None:
    sql(engine, "INSERT INTO profiles (id, email) VALUES ('p-mail', 'ann@example.com')")
    sql(engine, "INSERT INTO profiles (id, phone) VALUES ('p-phone', '+14155550100')")
    sql(engine, "INSERT INTO profiles (id, email, fields) VALUES ('p-list', 'b@x.io', '[1]')")
    for profile in ("p-phone", "nobody", "p-list", "p-mail"):
        sql(
            engine,
            "INSERT INTO notifications (channel, profile, subject, body)"
            " VALUES ('email', :profile, 'hi', 'hello')",
            profile=profile,
        )
    sql(engine, "INSERT INTO notifications (channel, profile) VALUES ('webhook', 'p-mail')")

    dispatch(engine, settings)

    assert sql(engine, "SELECT profile, status, last_error FROM notifications ORDER BY id") == [
        ("p-phone", "dead", f"{BAD}profile 'p-phone' has no email address: set its email"),
        (
            "nobody",
            "dead",
            f"{BAD}profile 'nobody' does not exist: upsert it into profiles before its rows"
            " are due, or address the row to a recipient",
        ),
        ("p-list", "dead", f"{BAD}profile 'p-list' has fields that are not a JSON object"),
        ("p-mail", "sent", None),
        (
            "p-mail",
            "dead",
            f"{BAD}profile 'p-mail' has no webhook address:"
            " webhook rows need their recipient written",
        ),
    ]
    assert [m.rcpt_tos for m in smtp_sink.messages] == [["ann@example.com"]]


def test_preferences_and_defaults_cancel_before_any_send_but_not_critical_rows(
    engine: Engine, make_settings: MakeSettings, smtp_sink: SmtpSink
) -> None:
    settings = make_settings(preference_defaults="digest=off", critical_categories="security")
    with engine.begin() as conn:
        client.upsert_profile(conn, "u", email="ann@example.com")
        profiles.set_preferences(conn, "u", {("marketing", "email"): False}, "person")
        profiles.set_preferences(conn, "u", {("security", "email"): False}, "person")
        profiles.set_preferences(conn, "u", {("news", "email"): True}, "operator")
        for n, category in enumerate(["marketing", "security", "news", "digest", None]):
            client.enqueue(
                conn, channel="email", profile="u", subject="s", body="b", category=category,
                key=f"k{n}",
            )  # fmt: skip

    dispatch(engine, settings)

    assert sql(engine, "SELECT category, status, last_error FROM notifications ORDER BY id") == [
        ("marketing", "cancelled", "preference: profile 'u' turned marketing off on email"),
        ("security", "sent", None),
        ("news", "sent", None),
        (
            "digest",
            "cancelled",
            "preference: digest is off on every channel for a person who has not turned it on"
            " (NOTIFIER_PREFERENCE_DEFAULTS), and profile 'u' has not",
        ),
        (None, "sent", None),
    ]
    assert len(smtp_sink.messages) == 3
    with engine.connect() as conn:
        changes = [(p.category, p.enabled, p.source) for p in profiles.history(conn, "u")]
    assert changes == [("news", True, "operator"), ("security", False, "person"),
                       ("marketing", False, "person")]  # fmt: skip


def test_a_suppressed_address_stops_a_profiles_critical_row_too(
    engine: Engine, settings: Settings, smtp_sink: SmtpSink
) -> None:
    sql(
        engine,
        "INSERT INTO suppressions (channel, recipient, reason, kind)"
        " VALUES ('email', 'ann@example.com', 'hard bounce', 'bounce')",
    )
    with engine.begin() as conn:
        client.upsert_profile(conn, "u", email="Ann@Example.com")
        client.enqueue(conn, channel="email", profile="u", subject="s", body="b",
                       category="security")  # fmt: skip

    dispatch(engine, settings)

    assert sql(engine, "SELECT status, last_error FROM notifications") == [
        ("cancelled", "suppressed: hard bounce")
    ]
    assert smtp_sink.messages == []


def test_the_client_refuses_what_a_worker_could_not_send(engine: Engine) -> None:
    with engine.begin() as conn:
        client.upsert_profile(conn, "u", phone="+14155550100")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"profile": "u"}, "profile 'u' has no email address"),
        ({"profile": "ghost"}, "no profile 'ghost'"),
        ({"profile": "has space"}, "profile id 'has space' is not"),
        ({}, "give the recipient"),
    ]
    for addressed, error in cases:
        with engine.begin() as conn, pytest.raises(ValueError, match=error):
            client.enqueue(conn, channel="email", subject="s", body="b", **addressed)
    with engine.begin() as conn:
        for bad, error in [
            ({"time_zone": "Mars/Olympus"}, "not an IANA name"),
            ({"time_zone": "../../etc/passwd"}, "not an IANA name"),
            ({"locale": "x y"}, "not a locale"),
            ({"fields": [1]}, "must be a mapping"),
        ]:
            with pytest.raises(ValueError, match=error):
                client.upsert_profile(conn, "u", **bad)
    assert sql(engine, "SELECT count(*) FROM notifications") == [(0,)]


def test_a_producer_login_upserts_profiles_and_addresses_rows_to_them(
    engine: Engine, login: Callable[[str], str]
) -> None:
    with psycopg.connect(login("notifier_producer")) as conn:
        client.upsert_profile(conn, "u", email="ann@example.com", time_zone="Europe/Vienna")
        client.upsert_profile(conn, "u", fields={"plan": "pro"})
        made = client.enqueue(conn, channel="email", profile="u", subject="s", body="b")
        profiles_seen = conn.execute("SELECT email, time_zone, fields FROM profiles").fetchall()
    assert made.created
    assert profiles_seen == [("ann@example.com", "Europe/Vienna", {"plan": "pro"})]
    for statement in ("SELECT * FROM preference_history", "DELETE FROM profiles"):
        with (
            psycopg.connect(login("notifier_producer")) as conn,
            pytest.raises(psycopg.errors.InsufficientPrivilege),
        ):
            conn.execute(statement)


NO_NUL = st.characters(codec="utf-8", exclude_characters="\x00")  # what text can hold


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    profile_id=st.text(NO_NUL, min_size=1, max_size=220)
    | st.from_regex(PROFILE_PATTERN, fullmatch=True),
    email=st.text(NO_NUL, max_size=3000),
    fields=st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(NO_NUL, max_size=50),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(NO_NUL), inner),
        max_leaves=10,
    ),
)
def test_no_profile_a_producer_can_write_makes_the_claim_fail(
    engine: Engine, settings: Settings, profile_id: str, email: str, fields: Any
) -> None:
    """Whatever a producer writes into a profile, the claim reads it and each row ends: the
    null channel's row (its own recipient) sent, or dead with a reason when the profile's
    fields are no JSON object; the email row (no email provider here) dead with a reason."""
    sql(engine, "DELETE FROM notifications; DELETE FROM profiles")
    write = "INSERT INTO profiles (id, email, fields) VALUES (:id, :email, CAST(:fields AS jsonb))"
    values = {"id": profile_id, "email": email, "fields": json.dumps(fields)}
    if re.fullmatch(PROFILE_PATTERN, profile_id) is None:
        with pytest.raises(IntegrityError, match="profiles_id"):
            sql(engine, write, **values)
        return
    sql(engine, write, **values)
    sql(
        engine,
        "INSERT INTO notifications (channel, profile, recipient)"
        " VALUES ('email', :id, ''), ('null', :id, 'x')",
        id=profile_id,
    )
    dispatcher = Dispatcher(engine, registry_of([NullProvider(Settings())]), settings)
    try:
        dispatcher.run_once()
    finally:
        dispatcher.close()
    ended = sql(engine, "SELECT channel, status, last_error FROM notifications ORDER BY 1")
    readable = isinstance(fields, dict)
    assert [(channel, status, error is not None) for channel, status, error in ended] == [
        ("email", "dead", True),
        ("null", "sent" if readable else "dead", not readable),
    ], ended


@pytest.mark.usefixtures("restore_logging", "database_url")
def test_the_profile_commands_set_show_and_prefer_on_someones_behalf(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(capsys, "profile", "show", "u-1")[0] == 1
    code, _, err = run(capsys, "profile", "set", "u-1", "--time-zone", "Moon/Base")
    assert (code, err) == (2, "notifier: time zone 'Moon/Base' is not an IANA name like"
                               " Europe/Vienna or UTC\n")  # fmt: skip
    argv = ["--email", "ann@example.com", "--locale", "de_at", "--field", "first_name=Ann",
            "--quiet-hours", "22:00-07:00"]  # fmt: skip
    assert run(capsys, "profile", "set", "u-1", *argv)[:2] == (0, "profile 'u-1' saved\n")
    assert run(capsys, "profile", "prefer", "u-1", "marketing", "email", "off")[0] == 0
    code, out, _ = run(capsys, "profile", "show", "u-1", "--json")
    shown = json.loads(out)
    assert code == 0
    assert (shown["profile"]["email"], shown["profile"]["locale"]) == ("ann@example.com", "de-AT")
    assert shown["profile"]["fields"] == {"first_name": "Ann"}
    assert (shown["profile"]["quiet_start"], shown["profile"]["quiet_end"]) == (
        "22:00:00",
        "07:00:00",
    )
    assert "quiet hours  22:00-07:00" in run(capsys, "profile", "show", "u-1")[1]
    code, _, err = run(capsys, "profile", "set", "u-1", "--quiet-hours", "7-8")
    assert (code, err[:40]) == (2, "notifier: quiet hours '7-8' are not HH:M")
    assert [(p["category"], p["enabled"], p["source"]) for p in shown["history"]] == [
        ("marketing", False, "operator")
    ]
    code, _, err = run(capsys, "profile", "prefer", "ghost", "marketing", "email", "off")
    assert (code, err) == (2, "notifier: no profile 'ghost': notifier profile set it first\n")


def around_now(zone: str, minutes: int = 60) -> tuple[str, str]:
    """Quiet hours from ``minutes`` before to ``minutes`` after the present in ``zone``."""
    local = datetime.now(ZoneInfo(zone))
    start, end = local - timedelta(minutes=minutes), local + timedelta(minutes=minutes)
    return f"{start:%H:%M}", f"{end:%H:%M}"


@pytest.mark.usefixtures("restore_logging")
def test_quiet_hours_hold_a_row_until_they_end_in_the_persons_zone_without_an_attempt(
    engine: Engine, make_settings: MakeSettings, smtp_sink: SmtpSink,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    start, end = around_now("Asia/Kathmandu")
    settings = make_settings(quiet_hours=f"marketing/email={start}-{end}")
    own_start, own_end = around_now("UTC")
    with engine.begin() as conn:
        client.upsert_profile(conn, "npl", email="a@example.com", time_zone="Asia/Kathmandu")
        client.upsert_profile(conn, "owl", email="b@example.com")
        for n, (profile, category) in enumerate(
            [("npl", "marketing"), ("npl", "security"), ("npl", None), ("owl", "news"),
             ("owl", "marketing")]
        ):  # fmt: skip
            client.enqueue(conn, channel="email", profile=profile, subject="s", body="b",
                           category=category, key=f"q{n}")  # fmt: skip
    # A window of the person's own, in a zone this machine does not know: the default zone.
    sql(
        engine,
        "UPDATE profiles SET quiet_start = :start, quiet_end = :end, time_zone = 'Mars/Base'"
        " WHERE id = 'owl'",
        start=own_start,
        end=own_end,
    )

    dispatch(engine, settings)

    rows = sql(
        engine,
        "SELECT status, attempts, deferrals, last_error, next_attempt_at FROM notifications"
        " ORDER BY id",
    )
    assert [row[:3] for row in rows] == [
        ("pending", 0, 0), ("sent", 1, 0), ("sent", 1, 0), ("pending", 0, 0), ("pending", 0, 0)
    ]  # fmt: skip
    nepal = rows[0][3]
    assert nepal.startswith(f"quiet hours {start}-{end} in Asia/Kathmandu: held until ")
    assert nepal.endswith(f" {end} there")
    expected = datetime.now(UTC) + timedelta(minutes=60)
    assert abs(rows[0][4] - expected) < timedelta(minutes=2)
    assert rows[3][3] == (
        f"quiet hours {own_start}-{own_end} in UTC (its time zone 'Mars/Base' is unknown):"
        f" held until {rows[3][4]:%Y-%m-%d} {own_end} there"
    )
    # Marketing's window is Kathmandu's present hour, not UTC's: the person's own holds it.
    assert rows[4][3] == rows[3][3].replace(own_end + " in", f"{own_end}, {start}-{end} in")
    assert sorted(m.rcpt_tos[0] for m in smtp_sink.messages) == ["a@example.com"] * 2
    history = sql(engine, "SELECT outcome, attempt FROM notification_attempts"
                          " WHERE notification_id = 1")  # fmt: skip
    assert history == [("held", 1)]
    code, out, _ = run(capsys, "show", "1")
    assert code == 0
    assert "held" in out
    assert "quiet hours" in out


def test_quiet_hours_that_leave_no_time_cancel_and_an_expiry_inside_them_cancels(
    engine: Engine, make_settings: MakeSettings, smtp_sink: SmtpSink
) -> None:
    start, end = around_now("UTC")
    windows = f"digest/email={end}-{start};digest={start}-{end};news={start}-{end}"
    settings = make_settings(quiet_hours=windows)
    soon = datetime.now(UTC) + timedelta(minutes=30)
    with engine.begin() as conn:
        client.upsert_profile(conn, "u", email="a@example.com")
        client.enqueue(conn, channel="email", profile="u", subject="s", body="b",
                       category="digest", key="always")  # fmt: skip
        client.enqueue(conn, channel="email", to="c@example.com", subject="s", body="b",
                       category="news", key="soon", expires_at=soon)  # fmt: skip
        client.enqueue(conn, channel="email", to="d@example.com", subject="s", body="b",
                       category="billing", key="day")  # fmt: skip

    dispatch(engine, settings)

    rows = sql(engine, "SELECT status, last_error FROM notifications ORDER BY id")
    assert rows[0] == (
        "cancelled", f"quiet hours {start}-{end}, {end}-{start} leave no time of day to send"
    )  # fmt: skip
    assert rows[1][0] == "cancelled"
    assert rows[1][1].startswith(
        f"expired: it would have waited past expires_at; quiet hours {start}-{end} in UTC"
    )
    assert rows[2] == ("sent", None)  # no window for billing
    assert [m.rcpt_tos for m in smtp_sink.messages] == [["d@example.com"]]


def test_a_campaign_to_profiles_reaches_each_person_once_as_their_settings_say(
    engine: Engine, make_settings: MakeSettings, smtp_sink: SmtpSink
) -> None:
    start, end = around_now("Asia/Tokyo")
    settings = make_settings(quiet_hours=f"marketing={start}-{end}", batch_size=100)
    with engine.begin() as conn:
        client.upsert_profile(conn, "p1", email="one@example.com", fields={"name": "One"})
        client.upsert_profile(conn, "p2", email="two@example.com", fields={"name": "Two"},
                              time_zone="Asia/Tokyo")  # fmt: skip
        client.upsert_profile(conn, "p3", email="three@example.com", fields={"name": "Three"})
        profiles.set_preferences(conn, "p3", {("marketing", "email"): False}, "person")
    campaigns = Campaigns(engine)
    with pytest.raises(CampaignError, match="does not know addresses at launch"):
        campaigns.create("bad", "email", subject="Hi {recipient}", body="x", audience="profiles")
    campaigns.create("spring", "email", subject="Hi {name}", body="Code {code}",
                     audience="profiles")  # fmt: skip
    audience = io.StringIO("profile,name\np1,One\np2,Two\np3,Three\np1,Again\n")
    assert campaigns.import_audience("spring", audience, "profile") == 3
    with pytest.raises(ValueError, match="profile id 'not an id'"):
        campaigns.import_audience("spring", io.StringIO("profile\nnot an id\n"), "profile")
    campaigns.generate_codes("spring", 3)
    assert campaigns.launch("spring") == 3
    assert campaigns.launch("spring") == 0  # a re-run writes nobody twice

    dispatch(engine, settings)

    rows = sql(engine, "SELECT profile, recipient, status, left(last_error, 40) FROM notifications"
                       " ORDER BY profile")  # fmt: skip
    assert rows == [
        ("p1", "", "sent", None),
        ("p2", "", "pending", f"quiet hours {start}-{end} in Asia/Tokyo: h"),
        ("p3", "", "cancelled", "preference: profile 'p3' turned marketin"),
    ]
    [message] = smtp_sink.messages
    assert message.rcpt_tos == ["one@example.com"]
    assert message.message["Subject"] == "Hi One"


def test_a_campaign_to_profiles_whose_chunk_has_rows_but_no_record_writes_only_the_rest(
    engine: Engine,
) -> None:
    # A chunk with rows and no record (written before chunk records existed, or its record
    # lost): the re-run must look for each person's row, by profile, not by the empty address.
    with engine.begin() as conn:
        for n in range(4):
            client.upsert_profile(conn, f"p{n}", email=f"p{n}@example.com")
    campaigns = Campaigns(engine)
    campaigns.create("spring", "email", subject="Hi", body="Code {code}", audience="profiles")
    campaigns.import_audience("spring", io.StringIO("profile\np0\np1\np2\np3\n"), "profile")
    campaigns.generate_codes("spring", 4)
    assert campaigns.launch("spring") == 4
    sql(engine, "DELETE FROM campaign_chunks")
    sql(engine, "DELETE FROM notifications WHERE profile = 'p2'")
    assert campaigns.launch("spring") == 1
    rows = sql(engine, "SELECT profile, payload->>'code' FROM notifications ORDER BY profile")
    assert [p for p, _ in rows] == ["p0", "p1", "p2", "p3"]
    assert len({code for _, code in rows}) == 4
