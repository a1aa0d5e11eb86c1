"""Suppression compares email addresses the way mailbox providers do, wherever an entry comes
from (an operator, a producer's SQL, a hard bounce) and wherever it is checked."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from notifier.delivery.outcomes import Cancelled
from notifier.delivery.prepare import Content
from notifier.providers.base import Permanent
from notifier.settings import Settings
from tests.integration.test_content import note, run, sql, suppress_by_sql, suppress_refused
from tests.migrations import migrate


def test_an_opt_out_suppresses_every_spelling_of_the_address(
    engine: Engine, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, "suppress", "add", "--channel", "email", "ann@example.com") == (
        0,
        "suppressed email ann@example.com\n",
    )
    rows = [
        note(1, "Ann@Example.COM"),
        note(2, " ann@example.com"),
        note(3, "ANN@EXAMPLE.COM\t"),
        note(4, "ann.b@example.com"),
    ]
    ready, results = Content(engine, settings).prepare(rows)
    assert [n.id for n in ready] == [4]
    assert results == {i: Cancelled("suppressed: added by operator") for i in (1, 2, 3)}


def test_every_way_in_stores_the_address_as_it_is_compared(
    engine: Engine, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    suppress_by_sql(engine, "email", " Bob@Example.com ", "unsubscribed")
    bounced = {1: Permanent("SMTP 550 5.1.1 no such user", suppress=True)}
    with engine.begin() as conn:
        assert suppress_refused(
            conn, Content(engine, settings), [note(1, "Gone@Example.COM")], bounced
        )
    assert sql(engine, "SELECT recipient FROM suppressions ORDER BY 1") == [
        ("bob@example.com",),
        ("gone@example.com",),
    ]
    status, out = run(capsys, "suppress", "add", "--channel", "email", "BOB@example.com")
    assert status == 0
    assert out.startswith("email bob@example.com already suppressed since")
    assert run(capsys, "suppress", "rm", "--channel", "email", "BOB@EXAMPLE.COM ")[0] == 0
    assert sql(engine, "SELECT recipient FROM suppressions") == [("gone@example.com",)]


def test_other_channels_compare_exactly(engine: Engine, settings: Settings) -> None:
    suppress_by_sql(engine, "push", "Token-AbC", "uninstalled")
    suppress_by_sql(engine, "sms", "+14155550100", "STOP")
    rows = [
        note(1, "Token-AbC", channel="push"),
        note(2, "token-abc", channel="push"),
        note(3, "+14155550100", channel="sms"),
    ]
    ready, results = Content(engine, settings).prepare(rows)
    assert [n.id for n in ready] == [2]
    assert set(results) == {1, 3}


def test_the_upgrade_lowercases_email_entries_and_merges_the_ones_that_coincide(
    engine: Engine,
) -> None:
    migrate(engine, "0008")
    sql(
        engine,
        """
        INSERT INTO suppressions (channel, recipient, reason, created_at) VALUES
            ('email', 'A@x.com', 'unsubscribed', now() - interval '2 days'),
            ('email', 'a@x.com', 'hard bounce', now() - interval '1 day'),
            ('email', ' B@X.com', 'asked us', now()),
            ('push', 'Tok', 'uninstalled', now()),
            ('push', 'tok', 'uninstalled', now())
        """,
    )
    migrate(engine, "head")
    assert sql(engine, "SELECT channel, recipient, reason FROM suppressions ORDER BY 1, 2") == [
        ("email", "a@x.com", "unsubscribed"),  # the oldest entry is kept
        ("email", "b@x.com", "asked us"),
        ("push", "Tok", "uninstalled"),
        ("push", "tok", "uninstalled"),
    ]
    migrate(engine, "0008")  # and back: the entries stay as they are
    assert len(sql(engine, "SELECT * FROM suppressions")) == 4
