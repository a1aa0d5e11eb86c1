"""The console's download of a campaign's failed recipients, against the real console process:
the same CSV as ``notifier campaign failures``, to a viewer as to an admin, only with the
session's CSRF token, and a campaign's name kept out of the response's headers."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from sqlalchemy import Engine, text

from notifier.campaigns.failures import campaign_id, failures_csv
from tests.console_server import Console, console_env, seed
from tests.factories import finished_campaign

NAME = 'spring "gift" ü/2026\r\nX-Injected: 1'


@pytest.fixture
def console(database_url: str, tmp_path: Path) -> Iterator[Console]:
    server = Console(console_env(database_url), tmp_path / "console.log").start()
    yield server
    server.stop()


def _failed_campaign(engine: Engine, name: str) -> int:
    campaign = finished_campaign(engine, name)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO notifications (channel, recipient, status, attempts, last_error,"
                " campaign_id) SELECT 'email', 'u' || g || '@example.com', 'dead', 5,"
                " CASE WHEN g = 1 THEN '=HYPERLINK(\"http://evil\")' ELSE '550 no such user'"
                " END, :c FROM generate_series(1, 12000) g"
            ),
            {"c": campaign},
        )
    return campaign


def _path(name: str) -> str:
    return f"/campaigns/{quote(name, safe='')}/failures.csv"


def test_a_viewer_downloads_the_same_csv_as_the_command_writes(
    console: Console, engine: Engine
) -> None:
    seed(engine)
    _failed_campaign(engine, NAME)
    bob = console.client()  # a viewer
    csrf = bob.login("bob")
    page = bob.request("GET", "/campaigns").text
    assert f'action="{_path(NAME)}"' in page  # the campaign's button, shown to a viewer

    r = bob.request("POST", _path(NAME), {"csrf": csrf})

    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "text/csv; charset=utf-8"
    assert r.headers["content-disposition"] == (
        'attachment; filename="spring__gift____2026__X-Injected__1-failures.csv";'
        f" filename*=UTF-8''{quote(NAME, safe='')}-failures.csv"
    )
    assert "x-injected" not in r.headers
    assert r.headers["cache-control"] == "no-store"
    expected = "".join(piece for piece, _ in failures_csv(engine, campaign_id(engine, NAME)))
    assert r.text == expected
    table = list(csv.reader(io.StringIO(r.text, newline="")))
    assert len(table) == 12001  # the header and three pages, whole
    first = next(row for row in table if row[0] == "u1@example.com")
    assert first[1:3] == ["dead", '\'=HYPERLINK("http://evil")']
    assert re.search(r"console bob downloaded the failed recipients of campaign", console.output())


def test_no_download_without_the_token_a_login_or_a_campaign(
    console: Console, engine: Engine
) -> None:
    _failed_campaign(engine, "spring")
    stranger = console.client()
    r = stranger.request("POST", _path("spring"), {"csrf": "x"})
    assert (r.status_code, r.headers["content-type"].split(";")[0]) == (403, "text/html")

    alice = console.client()
    csrf = alice.login("alice")
    r = alice.request("POST", _path("spring"))
    assert r.status_code == 403
    assert "security token" in r.text
    r = alice.request("POST", _path("spring"), {"csrf": csrf[::-1]})
    assert r.status_code == 403
    r = alice.request("GET", _path("spring"))  # a link cannot fetch it
    assert r.status_code == 404
    assert "u1@example.com" not in r.text

    r = alice.request("POST", _path("nope"), {"csrf": csrf})
    assert r.status_code == 404
    assert "no campaign named &#39;nope&#39;" in r.text

    r = alice.request("POST", _path("spring"), {"csrf": csrf})
    assert r.status_code == 200
    assert r.text.count("\r\n") == 12001
