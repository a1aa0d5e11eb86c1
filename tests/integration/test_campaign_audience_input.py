"""An audience's recipients checked for the campaign's channel, and its CSV file's encoding:
a recipient no row could be sent to refuses the import (or, asked to, is skipped and
reported); a spreadsheet's CSV UTF-8 imports, its byte order mark unseen; any other encoding
is refused with one line. Real files, real PostgreSQL."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from notifier.campaigns import CampaignError, Campaigns
from notifier.campaigns.audience_file import text_lines
from notifier.db.audience import AudienceImport, Invalid, InvalidRecipients
from tests.commands import run

pytestmark = pytest.mark.usefixtures("restore_logging")

NOT_AN_ADDRESS = (
    "recipient 'not-an-email' is not a plain ASCII email address like 'ada@example.com'"
    " (give an internationalised domain in punycode)"
)


@pytest.fixture
def campaigns(engine: Engine) -> Campaigns:
    campaigns = Campaigns(engine)
    campaigns.create("spring", "email", subject="Hi {name}", body="Hello")
    campaigns.create("texts", "sms", body="Hi {name}")
    return campaigns


def _recipients(engine: Engine, name: str = "spring") -> list[str]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT r.recipient FROM campaign_recipients r JOIN campaigns c"
                    " ON c.id = r.campaign_id WHERE c.name = :name ORDER BY r.position"
                ),
                {"name": name},
            ).scalars()
        )


def _import(campaigns: Campaigns, data: bytes, **kwargs: object) -> AudienceImport:
    return campaigns.import_csv("spring", text_lines(io.BytesIO(data)), "email", **kwargs)  # type: ignore[arg-type]


MIXED = b"email,name\na@x.org,A\nnot-an-email,B\nb@x.org,C\n,empty\nc@x.org;d@x.org,D\n"


def test_a_recipient_that_cannot_be_sent_to_refuses_the_import(
    engine: Engine, campaigns: Campaigns
) -> None:
    with pytest.raises(InvalidRecipients) as refused:
        _import(campaigns, MIXED)
    assert str(refused.value) == (
        f"2 lines of the audience have a recipient that cannot be sent to (line 3:"
        f" 'not-an-email': {NOT_AN_ADDRESS}; line 6: 'c@x.org;d@x.org': recipient"
        " 'c@x.org;d@x.org' lists several; send one row per address); nothing was imported:"
        " fix them, or import the rest skipping them (--skip-invalid)"
    )
    assert _recipients(engine) == []


def test_skip_invalid_imports_the_rest_and_reports_the_lines_it_skipped(
    engine: Engine, campaigns: Campaigns
) -> None:
    report = _import(campaigns, MIXED, skip_invalid=True)
    assert (report.added, report.invalid) == (2, 2)
    assert report.invalid_examples[0] == Invalid(3, "not-an-email", NOT_AN_ADDRESS)
    assert _recipients(engine) == ["a@x.org", "b@x.org"]


def test_the_refusal_counts_every_bad_line_and_names_the_first_five(
    campaigns: Campaigns,
) -> None:
    lines = b"".join(b"+1415555%04d\n" % i if i % 3 else b"0155%d\n" % i for i in range(30))
    with pytest.raises(InvalidRecipients) as refused:
        campaigns.import_csv("texts", text_lines(io.BytesIO(b"phone\n" + lines)), "phone")
    said = str(refused.value)
    assert said.startswith("10 lines of the audience have a recipient that cannot be sent to")
    assert said.count("is not an E.164 phone number") == 5
    assert "line 2: '01550'" in said
    assert "line 14: '015512'" in said
    assert "; ...); nothing was imported" in said
    assert "\n" not in said


def test_a_query_audience_is_checked_too(engine: Engine, campaigns: Campaigns) -> None:
    query = (
        "SELECT * FROM (VALUES ('a@x.org', 'A'), ('not-an-email', 'B'), ('+14155550100', 'C'))"
        " AS v(recipient, name)"
    )
    with pytest.raises(InvalidRecipients) as refused:
        campaigns.import_query("spring", query)
    assert str(refused.value).startswith(
        f"2 rows of the audience have a recipient that cannot be sent to (row 2: 'not-an-email':"
        f" {NOT_AN_ADDRESS}; row 3: '+14155550100': recipient '+14155550100' is not a plain"
    )
    assert _recipients(engine) == []
    report = campaigns.import_query("spring", query, skip_invalid=True)
    assert (report.added, report.invalid) == (1, 2)
    assert [i.line for i in report.invalid_examples] == [2, 3]
    assert _recipients(engine) == ["a@x.org"]


def test_a_campaign_of_a_channel_nobody_serves_imports_nothing(
    engine: Engine, campaigns: Campaigns
) -> None:
    campaigns.create("faxes", "fax", body="Hi")
    with pytest.raises(CampaignError, match="the campaign's channel: unknown channel 'fax'"):
        campaigns.import_csv("faxes", text_lines(io.BytesIO(b"recipient\nx\n")))


# --- the file's encoding -------------------------------------------------------------------------


def test_a_spreadsheets_csv_utf8_with_a_byte_order_mark_imports(
    engine: Engine, campaigns: Campaigns
) -> None:
    data = "email,name\r\nzoë@x.org,Zoë\r\n".replace("zoë@", "zoe@").encode("utf-8-sig")
    report = _import(campaigns, data)
    assert (report.added, report.fields) == (1, ["name"])
    with engine.connect() as conn:
        assert conn.execute(text("SELECT fields FROM campaign_recipients")).scalar() == {
            "name": "Zoë"
        }


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (
            "email,name\na@x.org,A\n".encode("utf-16"),
            "the audience CSV is UTF-16 (it starts with a UTF-16 byte order mark), not UTF-8:"
            " save it as CSV UTF-8 (in a spreadsheet: File, Save As, CSV UTF-8)",
        ),
        (
            "email,name\na@x.org,A\n".encode("utf-32"),
            "the audience CSV is UTF-32 (it starts with a UTF-32 byte order mark), not UTF-8:"
            " save it as CSV UTF-8 (in a spreadsheet: File, Save As, CSV UTF-8)",
        ),
        (
            "email,name\na@x.org,A\n".encode("utf-16-le"),
            "the audience CSV is not UTF-8 text: byte 2 (line 1) is a NUL byte, as in UTF-16;"
            " save it as CSV UTF-8 (in a spreadsheet: File, Save As, CSV UTF-8)",
        ),
        (
            "email,name\na@x.org,Zoë\n".encode("latin-1"),
            "the audience CSV is not UTF-8: byte 22 (line 2) is 0xEB, which UTF-8 does not have"
            " there (Latin-1 or Windows-1252?); save it as CSV UTF-8 (in a spreadsheet: File,"
            " Save As, CSV UTF-8)",
        ),
    ],
    ids=["utf-16", "utf-32", "utf-16 without a mark", "latin-1"],
)
def test_other_encodings_are_refused_with_one_line(
    engine: Engine, campaigns: Campaigns, data: bytes, said: str
) -> None:
    with pytest.raises(ValueError) as refused:
        _import(campaigns, data)
    assert str(refused.value) == said
    assert _recipients(engine) == []


def test_the_command_reads_the_file_as_a_spreadsheet_saves_it(
    capsys: pytest.CaptureFixture[str], engine: Engine, campaigns: Campaigns, tmp_path: Path
) -> None:
    path = tmp_path / "audience.csv"
    path.write_bytes("email,name\r\na@x.org,A\r\nnot-an-email,B\r\n".encode("utf-8-sig"))
    argv = ["campaign", "audience", "spring", "--csv", str(path), "--recipient-column", "email"]
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, "")
    assert err.startswith("notifier: 1 lines of the audience have a recipient that cannot be")
    assert "\ufeff" not in err
    code, out, err = run(capsys, *argv, "--skip-invalid", "--json")
    assert code == 0, err
    document = json.loads(out)
    assert (document["added"], document["invalid"]) == (1, 1)
    assert document["invalid_examples"] == [
        {"line": 3, "recipient": "not-an-email", "reason": NOT_AN_ADDRESS}
    ]
    path.write_bytes("email,name\nb@x.org,B\n".encode("utf-16"))
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, "")
    assert err == (
        "notifier: the audience CSV is UTF-16 (it starts with a UTF-16 byte order mark), not"
        " UTF-8: save it as CSV UTF-8 (in a spreadsheet: File, Save As, CSV UTF-8)\n"
    )
    assert _recipients(engine) == ["a@x.org"]


def test_the_command_reports_what_skip_invalid_left_out_of_a_query(
    capsys: pytest.CaptureFixture[str], campaigns: Campaigns
) -> None:
    query = "SELECT * FROM (VALUES ('a@x.org'), ('nope')) AS v(recipient)"
    code, out, _ = run(capsys, "campaign", "audience", "spring", "--query", query, "--skip-invalid")
    assert code == 0
    assert out.startswith(
        "1 recipients added; 1 rows skipped, their recipient cannot be sent to (row 2: 'nope':"
    )


# Pieces a hostile or broken CSV is made of: quotes, separators, line breaks of every kind,
# NUL, bytes that are not UTF-8, byte order marks, long fields.
PIECES = st.sampled_from(
    [
        b"a@x.org",
        b"not-an-email",
        b'"',
        b",",
        b"\n",
        b"\r\n",
        b"\r",
        b"\x00",
        b"\xff",
        b"\xc3",
        b"\xef\xbb\xbf",
        b"\xff\xfe",
        b" ",
        b"z" * 200_000,
        "Zoë".encode(),
        b"email",
    ]
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    body=st.one_of(st.binary(max_size=64), st.lists(PIECES, max_size=24).map(b"".join)),
    header=st.sampled_from([b"email,name\n", b"\xef\xbb\xbfemail,name\r\n", b""]),
    skip=st.booleans(),
)
def test_whatever_the_bytes_the_import_answers_or_refuses_with_one_line(
    campaigns: Campaigns, body: bytes, header: bytes, skip: bool
) -> None:
    try:
        _import(campaigns, header + body, skip_invalid=skip)
    except ValueError as exc:
        said = str(exc)
        assert said
        assert "\n" not in said
        assert "\r" not in said
        assert "\ufeff" not in said
