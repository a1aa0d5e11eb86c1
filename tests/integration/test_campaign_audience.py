"""A CSV audience whose recipients repeat: the first line of each is kept and the repeats are
reported, or, strictly, the whole file is refused with nothing imported. Real files, real
PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from notifier.campaigns import CampaignError, Campaigns
from notifier.db.audience import AudienceImport, Duplicate


@pytest.fixture
def campaigns(engine: Engine) -> Campaigns:
    campaigns = Campaigns(engine)
    campaigns.create("spring", "null", body="Hi {name}")
    return campaigns


def _file(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "audience.csv"
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def _import(campaigns: Campaigns, path: Path, on_duplicate: str = "skip") -> AudienceImport:
    with path.open(newline="", encoding="utf-8") as rows:
        return campaigns.import_csv("spring", rows, "email", on_duplicate=on_duplicate)


def _audience(engine: Engine) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT position, recipient, fields ->> 'name' FROM campaign_recipients ORDER BY 1"
            )
        )
        return [tuple(row) for row in rows]


REPEATS = (
    "email,name",
    "b@x.org,B first",  # line 2
    "a@x.org,A first",
    "b@x.org,B second",  # line 4
    '"c@x.org","C, on',
    'two lines"',
    " a@x.org ,A second",  # line 7: the same recipient once trimmed
    ",nobody",
    '"b@x.org","B, on',  # line 9
    'two lines"',
)


def test_the_first_line_of_each_recipient_is_kept_and_the_repeats_reported(
    engine: Engine, campaigns: Campaigns, tmp_path: Path
) -> None:
    report = _import(campaigns, _file(tmp_path, *REPEATS))
    assert report == AudienceImport(
        added=3,
        fields=["name"],
        duplicates=3,
        examples=[
            Duplicate(4, "b@x.org", 2),
            Duplicate(7, "a@x.org", 3),
            Duplicate(9, "b@x.org", 2),  # where its record starts
        ],
    )
    assert _audience(engine) == [
        (1, "a@x.org", "A first"),
        (2, "b@x.org", "B first"),
        (3, "c@x.org", "C, on\ntwo lines"),
    ]


def test_a_report_names_the_first_few_repeats_and_counts_them_all(
    campaigns: Campaigns, tmp_path: Path
) -> None:
    lines = [f"u{i % 10}@x.org,U{i}" for i in range(100)]
    report = _import(campaigns, _file(tmp_path, "email,name", *lines))
    assert (report.added, report.duplicates) == (10, 90)
    assert report.examples == [Duplicate(n, f"u{n - 12}@x.org", n - 10) for n in range(12, 17)]
    assert campaigns.status("spring").counts.recipients == 10


def test_strict_mode_refuses_the_whole_file_naming_the_first_repeat(
    engine: Engine, campaigns: Campaigns, tmp_path: Path
) -> None:
    with pytest.raises(ValueError) as refused:
        _import(campaigns, _file(tmp_path, *REPEATS), on_duplicate="refuse")
    assert str(refused.value) == (
        "audience CSV line 4 repeats 'b@x.org' from line 2 (3 repeated lines in all); nothing"
        " was imported: remove the repeats, or import keeping each recipient's first line"
    )
    assert _audience(engine) == []
    clean = _file(tmp_path, "email,name", "a@x.org,A", "b@x.org,B")
    assert _import(campaigns, clean, on_duplicate="refuse").added == 2
    with pytest.raises(CampaignError, match="on_duplicate is skip or refuse, not 'keep'"):
        _import(campaigns, clean, on_duplicate="keep")


def test_a_recipient_of_an_earlier_import_counts_once_and_keeps_its_fields(
    engine: Engine, campaigns: Campaigns, tmp_path: Path
) -> None:
    assert _import(campaigns, _file(tmp_path, "email,name", "a@x.org,A")).added == 1
    again = _import(campaigns, _file(tmp_path, "email,name", "b@x.org,B", "a@x.org,A again"))
    assert (again.added, again.duplicates, again.examples) == (1, 0, [])
    strict = _file(tmp_path, "email,name", "a@x.org,A", "c@x.org,C")
    assert _import(campaigns, strict, on_duplicate="refuse").added == 1
    assert _audience(engine) == [(1, "a@x.org", "A"), (2, "b@x.org", "B"), (3, "c@x.org", "C")]
    with strict.open(newline="", encoding="utf-8") as rows:
        assert campaigns.import_audience("spring", rows, "email") == 0
