"""A campaign's failures from the command line against a real PostgreSQL: ``notifier requeue
--campaign`` and ``notifier campaign failures`` (the CSV export)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from notifier.cli.campaign_exports import failures_json
from notifier.db.failures import failed_pages
from tests.commands import run
from tests.factories import MakeRow, MakeRows, finished_campaign

pytestmark = pytest.mark.usefixtures("restore_logging")


@pytest.fixture
def db(engine: Engine, database_url: str) -> Engine:
    """The test's database, which ``notifier`` commands run in this process also use."""
    return engine


def _status(db: Engine, ids: list[int]) -> dict[int, tuple[str, int]]:
    with db.connect() as conn:
        rows = conn.execute(
            text("SELECT id, status, attempts FROM notifications WHERE id = ANY(:ids)"),
            {"ids": ids},
        )
        return {r.id: (r.status, r.attempts) for r in rows}


# --- requeue --campaign ---------------------------------------------------------------------------


def test_requeue_by_campaign_takes_only_that_campaigns_dead_rows(
    db: Engine, capsys: pytest.CaptureFixture[str], make_row: MakeRow
) -> None:
    spring, autumn = finished_campaign(db, "spring"), finished_campaign(db, "autumn")
    dead = [
        make_row(channel="email", recipient=f"d{i}@example.com", status="dead", campaign_id=spring)
        for i in range(3)
    ]
    others = [
        make_row(channel="email", recipient="s@example.com", status="sent", campaign_id=spring),
        make_row(channel="email", recipient="p@example.com", campaign_id=spring),
        make_row(channel="email", recipient="a@example.com", status="dead", campaign_id=autumn),
        make_row(channel="email", recipient="t@example.com", status="dead"),
    ]
    before = _status(db, others)

    code, out, err = run(
        capsys, "requeue", "--campaign", "spring", "--confirm-above", "2", stdin="n\n"
    )
    assert code == 3
    assert "requeue 3 dead notifications? [y/N]" in err

    code, out, _ = run(capsys, "requeue", "--campaign", "spring", "--dry-run")
    assert (code, out.strip()) == (0, "3 dead notifications match; nothing requeued (dry run)")

    code, out, _ = run(capsys, "requeue", "--campaign", "spring", "--yes", "--json")
    assert code == 0
    assert json.loads(out)["requeued"] == 3
    assert _status(db, dead) == {r: ("pending", 0) for r in dead}
    assert _status(db, others) == before

    code, out, _ = run(capsys, "requeue", "--campaign", "spring")
    assert (code, out.strip()) == (1, "no dead notifications match; nothing requeued")


def test_requeue_by_campaign_combines_with_the_other_filters_and_batches(
    db: Engine, capsys: pytest.CaptureFixture[str], make_rows: MakeRows
) -> None:
    spring = finished_campaign(db, "spring")
    timeouts = make_rows(
        2500,
        channel="email",
        recipient=lambda i: f"t{i}@example.com",
        status="dead",
        campaign_id=spring,
        last_error="timed out",
    )
    refused = make_rows(
        3,
        channel="email",
        recipient=lambda i: f"r{i}@example.com",
        status="dead",
        campaign_id=spring,
        last_error="550 mailbox unavailable",
    )
    code, out, _ = run(
        capsys,
        "requeue",
        "--campaign",
        "spring",
        "--error",
        "timed out",
        "--yes",
        "--batch-size",
        "1000",
        "--json",
    )
    assert code == 0
    assert json.loads(out)["requeued"] == 2500
    assert set(_status(db, timeouts).values()) == {("pending", 0)}
    assert set(_status(db, refused).values()) == {("dead", 5)}


def test_requeue_of_an_unknown_campaign_says_so_on_one_line(
    db: Engine, capsys: pytest.CaptureFixture[str], make_row: MakeRow
) -> None:
    row = make_row(channel="email", recipient="t@example.com", status="dead")
    code, out, err = run(capsys, "requeue", "--campaign", "nope", "--yes")
    assert (code, out) == (2, "")
    assert err == "notifier: no campaign named 'nope'\n"
    assert _status(db, [row]) == {row: ("dead", 5)}


# --- campaign failures --------------------------------------------------------------------------


def _failures(db: Engine, make_row: MakeRow) -> tuple[int, dict[str, int]]:
    """A campaign with a dead row, a bounced one, and rows that did not fail."""
    spring = finished_campaign(db, "spring")
    rows = {
        "dead": make_row(
            channel="email",
            recipient="ann@example.com",
            status="dead",
            campaign_id=spring,
            attempts=5,
            last_error="550 no such user",
        ),
        "bounced": make_row(
            channel="email",
            recipient="bob@example.com",
            status="sent",
            campaign_id=spring,
            attempts=1,
            delivery_status="bounced",
            delivery_at="2026-12-01T10:00:00Z",
            delivery_detail='mailbox full, "quota"\nexceeded',
        ),
        "hostile": make_row(
            channel="email",
            recipient='=HYPERLINK("http://x")@example.com',
            status="dead",
            campaign_id=spring,
            last_error="-2+3 @SUM(A1) \r\n\tthe provider said so",
        ),
        "sent": make_row(
            channel="email", recipient="cy@example.com", status="sent", campaign_id=spring
        ),
        "delivered": make_row(
            channel="email",
            recipient="di@example.com",
            status="sent",
            campaign_id=spring,
            delivery_status="delivered",
            delivery_at="2026-12-01T10:00:00Z",
        ),
        "pending": make_row(channel="email", recipient="ed@example.com", campaign_id=spring),
        "elsewhere": make_row(channel="email", recipient="fi@example.com", status="dead"),
    }
    with db.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO notification_attempts (notification_id, attempt, at, worker,"
                " channel, outcome, error) VALUES (:id, 5, '2026-12-01T09:30:00Z', 'w1:1',"
                " 'email', 'dead', '550 no such user')"
            ),
            {"id": rows["dead"]},
        )
    return spring, rows


def test_failures_are_written_as_csv_with_their_reasons(
    db: Engine, capsys: pytest.CaptureFixture[str], make_row: MakeRow, tmp_path: Path
) -> None:
    _, rows = _failures(db, make_row)
    target = tmp_path / "spring.csv"

    code, out, err = run(capsys, "campaign", "failures", "spring", "--output", str(target))

    assert (code, out) == (0, "")
    assert err == f"3 failed recipients of campaign 'spring' to '{target}'\n"
    assert list(tmp_path.iterdir()) == [target]  # the temporary file was renamed, none left
    written = target.read_bytes().decode()
    assert written.startswith("recipient,status,reason,attempts,last_attempt_at,id\r\n")
    table = list(csv.reader(io.StringIO(written, newline="")))
    assert table[1:] == [
        [
            '\'=HYPERLINK("http://x")@example.com',
            "dead",
            "'-2+3 @SUM(A1) \r\n\tthe provider said so",
            "5",
            table[1][4],
            str(rows["hostile"]),
        ],
        [
            "ann@example.com",
            "dead",
            "550 no such user",
            "5",
            "2026-12-01T09:30:00+00:00",
            str(rows["dead"]),
        ],
        [
            "bob@example.com",
            "bounced",
            'mailbox full, "quota"\nexceeded',
            "1",
            table[3][4],
            str(rows["bounced"]),
        ],
    ]
    # Without attempt history: when the row died, when it was sent.
    assert table[1][4]
    assert table[3][4]


def test_failures_go_to_stdout_and_an_unknown_campaign_is_one_line(
    db: Engine, capsys: pytest.CaptureFixture[str], make_row: MakeRow
) -> None:
    _failures(db, make_row)
    code, out, err = run(capsys, "campaign", "failures", "spring")
    assert code == 0
    assert len(list(csv.reader(io.StringIO(out, newline="")))) == 4
    assert err == "3 failed recipients of campaign 'spring'\n"

    code, out, _ = run(capsys, "campaign", "failures", "spring", "--json")
    assert code == 0
    assert out.count("\n") == 1
    found = json.loads(out)
    assert [(f["recipient"], f["status"]) for f in found] == [
        ('=HYPERLINK("http://x")@example.com', "dead"),  # as it is: JSON goes to programs
        ("ann@example.com", "dead"),
        ("bob@example.com", "bounced"),
    ]
    assert set(found[0]) == {"recipient", "status", "reason", "attempts", "last_attempt_at", "id"}

    code, out, err = run(capsys, "campaign", "failures", "nope")
    assert (code, out, err) == (2, "", "notifier: no campaign named 'nope'\n")

    finished_campaign(db, "empty")
    code, out, err = run(capsys, "campaign", "failures", "empty")
    assert (code, out) == (0, "recipient,status,reason,attempts,last_attempt_at,id\r\n")


def test_the_export_walks_every_page_once_by_recipient(db: Engine, make_rows: MakeRows) -> None:
    spring = finished_campaign(db, "spring")
    ids = make_rows(
        2345,
        channel="email",
        recipient=lambda i: f"u{i:05}@example.com",
        status="dead",
        campaign_id=spring,
    )
    pages = list(failed_pages(db, spring, page=1000))
    assert [len(p) for p in pages] == [1000, 1000, 345]
    recipients = [f.recipient for p in pages for f in p]
    assert recipients == sorted(recipients)
    assert sorted(f.id for p in pages for f in p) == sorted(ids)
    as_json = json.loads("".join(piece for piece, _ in failures_json(db, spring, page=1000)))
    assert [f["recipient"] for f in as_json] == recipients


def test_an_export_that_fails_half_way_leaves_the_old_file(
    db: Engine, capsys: pytest.CaptureFixture[str], make_row: MakeRow, tmp_path: Path
) -> None:
    _failures(db, make_row)
    target = tmp_path / "spring.csv"
    target.write_text("the export of yesterday\n")
    with db.begin() as conn:  # the export's read of a page fails: a table it reads is gone
        conn.execute(text("ALTER TABLE notification_attempts RENAME TO attempts_gone"))
    try:
        with pytest.raises(Exception, match="attempts"):
            run(capsys, "campaign", "failures", "spring", "--output", str(target))
    finally:
        with db.begin() as conn:
            conn.execute(text("ALTER TABLE attempts_gone RENAME TO notification_attempts"))
    assert target.read_text() == "the export of yesterday\n"
    assert list(tmp_path.iterdir()) == [target]
