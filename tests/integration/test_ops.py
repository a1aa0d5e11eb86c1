"""The operators' commands against a real PostgreSQL: stats, show, requeue, cancel, purge."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from notifier import ops
from notifier.campaigns import Campaigns
from notifier.settings import Settings
from tests.commands import run
from tests.factories import MakeRow, ago

REPO = Path(__file__).resolve().parents[2]
#: Whose rows these tests hold, unless a test says otherwise.
ANN = {"channel": "email", "recipient": "ann@example.com"}


def _attempt(
    engine: Engine, row_id: int, attempt: int, outcome: str, *, at: str = "now()", **cols: Any
) -> None:
    values = {"worker": "w1:42", "channel": "email", "error": None, "duration_ms": 12, **cols}
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO notification_attempts"
                " (notification_id, attempt, at, worker, channel, outcome, error, duration_ms)"
                f" VALUES (:id, :attempt, {at}, :worker, :channel, :outcome, :error, :duration_ms)"
            ),
            {"id": row_id, "attempt": attempt, "outcome": outcome, **values},
        )


def _statuses(engine: Engine) -> dict[int, tuple[str, int, str | None]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id, status, attempts, last_error FROM notifications"))
        return {r.id: (r.status, r.attempts, r.last_error) for r in rows}


# The commands set up logging for the process; each test puts the test session's back.
pytestmark = pytest.mark.usefixtures("restore_logging")


@pytest.fixture
def db(engine: Engine, database_url: str) -> Engine:
    """The test's database, which ``notifier`` commands run in this process also use."""
    return engine


# --- stats ----------------------------------------------------------------------------------------


def test_stats_json_has_counts_lag_and_sent_per_minute(
    db: Engine, capsys: pytest.CaptureFixture[str], make_row: MakeRow
) -> None:
    due = make_row(**ANN, created_at=ago(minutes=3))
    with db.begin() as conn:  # the oldest due row has waited three minutes
        conn.execute(
            text(
                "UPDATE notifications SET next_attempt_at = now() - interval '3 min' WHERE id = :id"
            ),
            {"id": due},
        )
    sent = make_row(**ANN, status="sent")
    dead = make_row(channel="webhook", recipient="https://hooks.example.com/x", status="dead")
    with db.connect() as conn:
        two_ago = conn.execute(
            text("SELECT date_trunc('minute', now()) - interval '2 min'")
        ).scalar_one()
    at = "date_trunc('minute', now()) - interval '2 min' + interval '10 s'"
    for n in range(3):
        _attempt(db, sent, n + 1, "sent", at=at)
    _attempt(db, dead, 1, "retry", at=at)
    _attempt(db, dead, 2, "dead")  # in the minute under way

    code, out, _ = run(capsys, "stats", "--json")
    assert code == 0
    stats = json.loads(out)
    assert set(stats) == {
        "by_status_channel",
        "due",
        "lag_seconds",
        "rate_limits",
        "sent_per_minute",
        "status_events",
        "throughput",
    }
    assert stats["status_events"] == {
        "pending": 0,
        "processing": 0,
        "dead": 0,
        "oldest_pending_seconds": 0.0,
    }
    assert {(r["status"], r["channel"], r["count"]) for r in stats["by_status_channel"]} == {
        ("pending", "email", 1),
        ("sent", "email", 1),
        ("dead", "webhook", 1),
    }
    assert stats["due"] == 1
    assert 170 < stats["lag_seconds"] < 600
    minutes = stats["throughput"]
    assert len(minutes) == 6  # five whole minutes and the one under way
    assert [m["partial"] for m in minutes] == [False] * 5 + [True]
    assert set(minutes[0]) == {"minute", "sent", "retry", "dead", "partial"}
    by_minute = {datetime.fromisoformat(m["minute"]): m for m in minutes}
    assert (by_minute[two_ago]["sent"], by_minute[two_ago]["retry"]) == (3, 1)
    assert sum(m["dead"] for m in minutes) == 1
    assert stats["sent_per_minute"] == pytest.approx(3 / 5)

    code, out, _ = run(capsys, "stats")
    assert code == 0
    assert "STATUS" in out
    assert "webhook" in out
    assert "due now: 1" in out
    assert "(so far)" in out
    assert "sent per minute: 0.6" in out


# --- show -----------------------------------------------------------------------------------------


def test_show_prints_the_row_and_its_whole_history_in_order(
    db: Engine, capsys: pytest.CaptureFixture[str], make_row: MakeRow
) -> None:
    row = make_row(
        **ANN, status="dead", last_error="gave up after 3 attempts; last error: 550 no such user"
    )
    _attempt(db, row, 1, "retry", error="421 try later", duration_ms=120, worker="host-a:1")
    _attempt(db, row, 2, "rescued", error="lease expired: worker host-b:2", duration_ms=None)
    _attempt(db, row, 3, "dead", error="550 no such user", duration_ms=80, worker="host-c:3")

    code, out, _ = run(capsys, "show", str(row))
    assert code == 0
    assert f"notification {row}" in out
    assert "ann@example.com" in out
    assert "gave up after 3 attempts" in out
    history = out.split("attempts (3)", 1)[1]
    positions = [history.index(s) for s in ("421 try later", "lease expired", "550 no such")]
    assert positions == sorted(positions)
    assert "host-a:1" in history
    assert "120 ms" in history
    assert "rescued" in history

    code, out, _ = run(capsys, "show", str(row), "--json")
    story = json.loads(out)
    assert story["notification"]["status"] == "dead"
    assert [(a["attempt"], a["outcome"], a["worker"]) for a in story["attempts"]] == [
        (1, "retry", "host-a:1"),
        (2, "rescued", "w1:42"),
        (3, "dead", "host-c:3"),
    ]

    assert run(capsys, "show", "999999")[0] == 1


# --- requeue --------------------------------------------------------------------------------------


def _assert_requeued(db: Engine, requeued: set[int], untouched: dict[int, Any]) -> None:
    now = _statuses(db)
    for row in requeued:
        assert now[row][:2] == ("pending", 0), row
    for row, before in untouched.items():
        assert now[row] == before, row
    with db.connect() as conn:
        late = conn.execute(
            text(
                "SELECT count(*) FROM notifications"
                " WHERE id = ANY(:ids) AND next_attempt_at > now()"
            ),
            {"ids": list(requeued)},
        ).scalar_one()
    assert late == 0


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--channel", "webhook"], {"hook_old", "hook_new"}),
        (["--channel", "webhook", "--channel", "sms"], {"hook_old", "hook_new", "sms"}),
        (["--last", "2h"], {"hook_new", "sms", "timeout"}),
        (["--since", "{3h_ago}", "--until", "{90m_ago}"], {"sms"}),
        (["--error", "TIMED OUT"], {"timeout"}),
        (["--error", "%"], {"percent"}),
        (["--id", "{hook_old}", "--id", "{sms}"], {"hook_old", "sms"}),
        (["--all"], {"hook_old", "hook_new", "sms", "timeout", "percent"}),
    ],
)
def test_requeue_filters(
    db: Engine,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    expected: set[str],
    make_row: MakeRow,
) -> None:
    rows = {
        "hook_old": make_row(
            channel="webhook", recipient="ann@example.com", status="dead", updated_at=ago(days=3)
        ),
        "hook_new": make_row(
            channel="webhook", recipient="ann@example.com", status="dead", updated_at=ago(minutes=5)
        ),
        "sms": make_row(
            channel="sms", recipient="ann@example.com", status="dead", updated_at=ago(minutes=100)
        ),
        "timeout": make_row(
            **ANN, status="dead", updated_at=ago(minutes=1), last_error="SMTP: timed out"
        ),
        "percent": make_row(
            **ANN, status="dead", updated_at=ago(days=2), last_error="quota 100% used"
        ),
        "sent": make_row(**ANN, status="sent"),
        "pending": make_row(**ANN),
        "cancelled": make_row(**ANN, status="cancelled", last_error="user confirmed"),
    }
    now = datetime.now(UTC)
    names = {
        **{k: str(v) for k, v in rows.items()},
        "3h_ago": (now - timedelta(hours=3)).isoformat(),
        "90m_ago": (now - timedelta(minutes=90)).isoformat(),
    }
    before = _statuses(db)

    code, out, _ = run(capsys, "requeue", *(a.format(**names) for a in args), "--json")

    assert code == 0, out
    assert json.loads(out) == {
        "matched": len(expected),
        "requeued": len(expected),
        "left": 0,
        "dry_run": False,
    }
    requeued = {rows[name] for name in expected}
    _assert_requeued(db, requeued, {r: before[r] for r in rows.values() if r not in requeued})


def test_requeue_asks_above_the_threshold_and_a_no_changes_nothing(
    db: Engine, capsys: pytest.CaptureFixture[str], make_row: MakeRow
) -> None:
    dead = {make_row(**ANN, status="dead") for _ in range(4)}
    before = _statuses(db)

    code, out, err = run(capsys, "requeue", "--all", "--confirm-above", "3", stdin="n\n")
    assert (code, out.strip()) == (3, "not confirmed; nothing requeued (--yes skips the question)")
    assert "requeue 4 dead notifications? [y/N]" in err
    assert _statuses(db) == before

    code, out, _ = run(capsys, "requeue", "--all", "--confirm-above", "3", stdin="")  # EOF
    assert code == 3
    assert _statuses(db) == before

    code, out, _ = run(capsys, "requeue", "--all", "--confirm-above", "3", "--dry-run")
    assert (code, out.strip()) == (0, "4 dead notifications match; nothing requeued (dry run)")
    assert _statuses(db) == before

    code, out, _ = run(capsys, "requeue", "--all", "--confirm-above", "3", stdin="y\n")
    assert (code, out.strip()) == (0, "requeued 4 dead notifications")
    _assert_requeued(db, dead, {})


def test_requeue_with_yes_does_not_ask_and_below_the_threshold_nobody_is_asked(
    db: Engine,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    make_row: MakeRow,
) -> None:
    many = {
        make_row(channel="webhook", recipient="ann@example.com", status="dead") for _ in range(3)
    }
    few = {make_row(channel="sms", recipient="ann@example.com", status="dead") for _ in range(2)}
    closed = io.StringIO("")
    closed.close()
    monkeypatch.setattr(sys, "stdin", closed)  # reading it would fail: exit status 2

    code, _, err = run(capsys, "requeue", "--channel", "webhook", "--confirm-above", "2", "--yes")
    assert code == 0
    assert "[y/N]" not in err
    code, _, err = run(capsys, "requeue", "--channel", "sms", "--confirm-above", "2")
    assert code == 0
    assert "[y/N]" not in err
    _assert_requeued(db, many | few, {})


def test_requeue_refuses_without_a_filter_and_says_when_nothing_matches(
    db: Engine, capsys: pytest.CaptureFixture[str], make_row: MakeRow
) -> None:
    make_row(**ANN, status="dead")
    code, _, err = run(capsys, "requeue")
    assert code == 2
    assert "no filter given" in err
    assert "--all" in err
    code, out, _ = run(capsys, "requeue", "--channel", "push")
    assert (code, out.strip()) == (1, "no dead notifications match; nothing requeued")


def test_requeue_walks_a_large_set_in_batches(
    db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    with db.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO notifications (channel, recipient, status, attempts, last_error)"
                " SELECT 'null', 'x' || g, 'dead', 5, 'boom' FROM generate_series(1, 12345) g"
            )
        )
    code, out, _ = run(capsys, "requeue", "--all", "--yes", "--batch-size", "1000")
    assert (code, out.strip()) == (0, "requeued 12345 dead notifications")
    with db.connect() as conn:
        assert (
            conn.execute(
                text("SELECT count(*) FROM notifications WHERE status = 'pending' AND attempts = 0")
            ).scalar_one()
            == 12345
        )


def test_a_row_locked_throughout_is_left_and_reported(
    db: Engine, capsys: pytest.CaptureFixture[str], make_row: MakeRow
) -> None:
    locked, free = make_row(**ANN, status="dead"), make_row(**ANN, status="dead")
    with db.connect() as holder:
        holder.execute(
            text("SELECT 1 FROM notifications WHERE id = :id FOR UPDATE"), {"id": locked}
        )
        code, out, _ = run(capsys, "requeue", "--all", "--yes")
        holder.rollback()
    assert (code, out.strip()) == (
        0,
        "requeued 1 dead notifications; 1 were held by a worker each time: run it again",
    )
    assert _statuses(db)[free][0] == "pending"
    assert _statuses(db)[locked][0] == "dead"


def test_a_row_locked_for_a_moment_is_found_by_the_next_walk(db: Engine, make_row: MakeRow) -> None:
    locked, free = make_row(**ANN, status="dead"), make_row(**ANN, status="dead")
    holder = db.connect()
    holder.execute(text("SELECT 1 FROM notifications WHERE id = :id FOR UPDATE"), {"id": locked})
    release = threading.Timer(0.1, holder.rollback)
    release.start()
    try:
        count, snap = ops.count_requeue(db, ops.DeadFilter())
        change = ops.requeue(db, ops.DeadFilter(), snap)
    finally:
        release.join()
        holder.close()
    assert (count, change) == (2, ops.Change(changed=2, left=0))
    assert {_statuses(db)[r][0] for r in (locked, free)} == {"pending"}


# --- cancel ---------------------------------------------------------------------------------------


def test_cancel_takes_every_id_it_is_given(
    db: Engine, capsys: pytest.CaptureFixture[str], make_row: MakeRow
) -> None:
    first, second, sent = make_row(**ANN), make_row(**ANN), make_row(**ANN, status="sent")

    code, out, _ = run(capsys, "cancel", "--id", str(first), "--id", str(second))
    assert (code, out) == (0, f"cancelled notification {first}\ncancelled notification {second}\n")
    code, out, _ = run(capsys, "cancel", "--id", str(sent), "--id", str(first))
    assert code == 1
    assert out.splitlines() == [
        f"notification {sent} was not waiting to be sent (no such row, or already finished)",
        f"notification {first} was not waiting to be sent (no such row, or already finished)",
    ]
    statuses = _statuses(db)
    assert (statuses[first][0], statuses[second][0], statuses[sent][0]) == (
        "cancelled",
        "cancelled",
        "sent",
    )


def test_campaign_commands_say_what_they_did(
    db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    Campaigns(db).create("spring", "null", subject="Hi", body="Your code: {code}")

    code, out, _ = run(capsys, "campaign", "cancel", "spring")
    assert (code, out) == (0, "campaign 'spring': cancelled; 0 notifications cancelled\n")


def test_send_refuses_a_channel_no_provider_serves(
    db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "send", "--channel", "emial", "--to", "ann@example.com")
    assert (code, out) == (2, "")
    assert err.startswith("notifier: no provider serves channel 'emial' (installed: ")
    assert err.endswith("; did you mean 'email'?\n")
    assert _statuses(db) == {}


def test_send_refuses_a_row_that_would_expire_before_it_is_due(
    db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["send", "--channel", "null", "--to", "x", "--in", "10s", "--expires-in", "5s"]
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, "")
    assert "--expires-in ends before the send time" in err
    assert _statuses(db) == {}


def test_cancel_by_key_or_id_keeps_its_messages(
    db: Engine, capsys: pytest.CaptureFixture[str], make_row: MakeRow
) -> None:
    keyed, by_id, sent = (
        make_row(**ANN, dedupe_key="reminder:42"),
        make_row(**ANN),
        make_row(**ANN, status="sent"),
    )

    assert run(capsys, "cancel", "reminder:42", "--reason", "user confirmed")[:2] == (
        0,
        "cancelled the notification with key 'reminder:42'\n",
    )
    assert run(capsys, "cancel", "--id", str(by_id))[:2] == (
        0,
        f"cancelled notification {by_id}\n",
    )
    assert run(capsys, "cancel", "--id", str(sent))[:2] == (
        1,
        f"notification {sent} was not waiting to be sent (no such row, or already finished)\n",
    )
    statuses = _statuses(db)
    assert statuses[keyed] == ("cancelled", 0, "user confirmed")
    assert statuses[by_id] == ("cancelled", 0, "cancelled by operator")
    assert statuses[sent][0] == "sent"

    code, _, err = run(capsys, "cancel", "reminder:42", "--channel", "email")
    assert code == 2
    assert "leave out filters" in err


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--channel", "sms"], {"sms_old", "sms_processing"}),
        (["--campaign", "spring"], {"campaign"}),
        (["--last", "2h"], {"sms_processing", "campaign", "email"}),
        (["--since", "{3d_ago}", "--until", "{1h_ago}"], {"sms_old"}),
        (["--status", "processing"], {"sms_processing"}),
        (["--channel", "sms", "--status", "pending"], {"sms_old"}),
        (["--all"], {"sms_old", "sms_processing", "campaign", "email"}),
    ],
)
def test_cancel_filters(
    db: Engine,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    expected: set[str],
    make_row: MakeRow,
) -> None:
    with db.begin() as conn:
        spring = conn.execute(
            text(
                "INSERT INTO campaigns (name, channel, status) VALUES ('spring', 'email',"
                " 'running') RETURNING id"
            )
        ).scalar_one()
    rows = {
        "sms_old": make_row(channel="sms", recipient="ann@example.com", created_at=ago(days=2)),
        "sms_processing": make_row(channel="sms", recipient="ann@example.com", status="processing"),
        "campaign": make_row(**ANN, campaign_id=spring),
        "email": make_row(**ANN),
        "sent": make_row(
            channel="sms", recipient="ann@example.com", status="sent", created_at=ago(days=2)
        ),
        "dead": make_row(channel="sms", recipient="ann@example.com", status="dead"),
    }
    now = datetime.now(UTC)
    names = {
        "3d_ago": (now - timedelta(days=3)).isoformat(),
        "1h_ago": (now - timedelta(hours=1)).isoformat(),
    }
    before = _statuses(db)

    code, out, _ = run(
        capsys, "cancel", *(a.format(**names) for a in args), "--reason", "outage", "--json"
    )

    assert code == 0, out
    assert json.loads(out)["cancelled"] == len(expected)
    after = _statuses(db)
    for name, row in rows.items():
        if name in expected:
            assert after[row] == ("cancelled", 0, "outage"), name
        else:
            assert after[row] == before[row], name


def test_bulk_cancel_confirmation_dry_run_and_unknown_campaign(
    db: Engine, capsys: pytest.CaptureFixture[str], make_row: MakeRow
) -> None:
    waiting = {make_row(channel="webhook", recipient="ann@example.com") for _ in range(3)}
    before = _statuses(db)

    code, out, err = run(
        capsys, "cancel", "--channel", "webhook", "--confirm-above", "2", stdin="no\n"
    )
    assert code == 3
    assert "cancel 3 unsent notifications? [y/N]" in err
    assert _statuses(db) == before

    code, out, _ = run(capsys, "cancel", "--channel", "webhook", "--dry-run")
    assert (code, out.strip()) == (0, "3 unsent notifications match; nothing cancelled (dry run)")
    assert _statuses(db) == before

    code, _, err = run(capsys, "cancel", "--campaign", "nope", "--yes")
    assert code == 2
    assert "no campaign named 'nope'" in err

    code, _, err = run(capsys, "cancel")
    assert code == 2
    assert "no filter given" in err

    code, out, _ = run(capsys, "cancel", "--channel", "webhook", "--confirm-above", "2", "--yes")
    assert (code, out.strip()) == (0, "cancelled 3 unsent notifications")
    assert {_statuses(db)[r][0] for r in waiting} == {"cancelled"}


def test_the_real_command_reads_no_from_its_stdin(
    db: Engine, database_url: str, make_row: MakeRow
) -> None:
    dead = [make_row(**ANN, status="dead") for _ in range(2)]
    command = subprocess.run(
        [sys.executable, "-m", "notifier.cli", "requeue", "--all", "--confirm-above", "1"],
        cwd=REPO,
        input="n\n",
        env={"PATH": "/usr/bin:/bin", "NOTIFIER_DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert command.returncode == 3, command.stderr
    assert "requeue 2 dead notifications? [y/N]" in command.stderr
    assert {_statuses(db)[r][0] for r in dead} == {"dead"}


# --- purge ----------------------------------------------------------------------------------------


@pytest.fixture
def aged(db: Engine, make_row: MakeRow) -> Iterator[dict[str, int]]:
    """Rows of every status on both sides of their retention (30 / 365 / 30 days)."""
    old, young = timedelta(days=400), timedelta(days=10)
    rows = {
        "sent_old": make_row(**ANN, status="sent", created_at=ago(old), updated_at=ago(days=31)),
        "sent_young": make_row(**ANN, status="sent", created_at=ago(old), updated_at=ago(young)),
        "dead_old": make_row(**ANN, status="dead", created_at=ago(old), updated_at=ago(days=366)),
        "dead_young": make_row(**ANN, status="dead", created_at=ago(old), updated_at=ago(days=200)),
        "cancelled_old": make_row(
            **ANN, status="cancelled", created_at=ago(old), updated_at=ago(days=45)
        ),
        "cancelled_young": make_row(
            **ANN, status="cancelled", created_at=ago(old), updated_at=ago(young)
        ),
        "pending_old": make_row(**ANN, created_at=ago(old), updated_at=ago(old)),
        "processing_old": make_row(
            **ANN, status="processing", created_at=ago(old), updated_at=ago(old)
        ),
    }
    for name, row in rows.items():
        _attempt(db, row, 1, "retry")
        if name.startswith(("sent", "dead")):
            _attempt(db, row, 2, name.split("_")[0])
    return rows


def _attempt_counts(db: Engine) -> dict[int, int]:
    with db.connect() as conn:
        rows = conn.execute(
            text("SELECT notification_id, count(*) FROM notification_attempts GROUP BY 1")
        )
        return {r[0]: r[1] for r in rows}


def test_purge_deletes_expired_finished_rows_only(
    db: Engine, aged: dict[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "purge", "--json", "--batch-size", "1")
    assert code == 0
    report = json.loads(out)
    assert report["deleted"] == {"sent": 1, "dead": 1, "cancelled": 1}
    assert report["attempts"] == 0  # written this week: kept with it (test_history_weeks.py)
    assert set(report["before"]) == {"sent", "dead", "cancelled"}

    gone = {aged["sent_old"], aged["dead_old"], aged["cancelled_old"]}
    left = _statuses(db)
    assert set(left) == set(aged.values()) - gone
    assert left[aged["pending_old"]][0] == "pending"
    assert left[aged["processing_old"]][0] == "processing"
    attempts = _attempt_counts(db)
    assert attempts[aged["sent_old"]] == 2  # a row's history goes with its week, not the row
    assert attempts[aged["sent_young"]] == 2
    assert attempts[aged["pending_old"]] == 1

    code, out, _ = run(capsys, "purge")  # nothing left to do
    assert code == 0
    assert "DELETED" in out


def test_purge_dry_run_counts_and_deletes_nothing(
    db: Engine, aged: dict[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "purge", "--dry-run", "--json")
    assert code == 0
    report = json.loads(out)
    assert (report["dry_run"], report["deleted"], report["attempts"]) == (
        True,
        {"sent": 1, "dead": 1, "cancelled": 1},
        0,
    )
    assert set(_statuses(db)) == set(aged.values())
    code, out, _ = run(capsys, "purge", "--dry-run")
    assert "WOULD DELETE" in out
    assert "(attempts)" in out


def test_purge_follows_the_retention_settings(
    db: Engine, aged: dict[str, int], settings: Settings
) -> None:
    report = ops.purge(
        db,
        settings.model_copy(update={"retention_sent_days": 5, "retention_dead_days": 250}),
    )
    assert report.deleted == {"sent": 2, "dead": 1, "cancelled": 1}
    assert aged["dead_young"] in _statuses(db)


def test_a_purge_out_of_time_says_where_to_resume(
    db: Engine, aged: dict[str, int], settings: Settings
) -> None:
    stopped = ops.purge(db, settings, budget_seconds=0)
    assert (stopped.finished, sum(stopped.deleted.values())) == (False, 0)

    skipped = ops.purge(db, settings, after=aged["dead_old"])  # resumes above that id
    assert skipped.deleted == {"sent": 0, "dead": 0, "cancelled": 1}
    rest = ops.purge(db, settings)
    assert rest.deleted == {"sent": 1, "dead": 1, "cancelled": 0}


def test_the_purge_task_runs_the_same_purge(
    db: Engine, aged: dict[str, int], redis_url: str
) -> None:
    from notifier.worker import tasks

    assert tasks.purge() == {"sent": 1, "dead": 1, "cancelled": 1}
    assert set(_statuses(db)) == set(aged.values()) - {
        aged["sent_old"],
        aged["dead_old"],
        aged["cancelled_old"],
    }
