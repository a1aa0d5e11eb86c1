"""What the console shows of a recipient: masked, with a tag that tells rows apart, the whole
address only on demand; and its own log lines keep what is not an address (its port)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.console_server import Console, console_env, seed

#: A list row's id and recipient cell; the recipient on a row's page, masked and revealed.
_ROW = re.compile(
    r'<a href="/notifications/(\d+)">.*?<td class="recipient">([^<]*)</td>', re.DOTALL
)
_DETAIL = re.compile(r'class="recipient">\s*([^<]*?)\s*<form')
_REVEALED = re.compile(r'class="recipient">\s*([^<]*?)\s*</td>')


@pytest.fixture
def console(database_url: str, tmp_path: Path) -> Iterator[Console]:
    server = Console(console_env(database_url), tmp_path / "console.log").start()
    yield server
    server.stop()


def test_masked_rows_of_one_domain_read_apart_and_reveal_shows_the_address(
    console: Console, engine: Engine
) -> None:
    seed(engine)  # the campaign's rows go to c1@, c2@ and c3@example.com
    alice = console.client()
    csrf = alice.login("alice")
    page = alice.request("GET", "/notifications?campaign=spring").text
    rows = dict(_ROW.findall(page))
    assert len(rows) == 3
    assert all(re.fullmatch(r"c\*\*\*@example\.com #[0-9a-f]{4}", cell) for cell in rows.values())
    assert len(set(rows.values())) == 3, rows  # three people, three tags
    assert "c1@example.com" not in page
    # a person's tag is the same on the next look, and on the row's own page
    assert dict(_ROW.findall(alice.request("GET", "/notifications?campaign=spring").text)) == rows
    row_id, cell = next(iter(rows.items()))
    detail = _DETAIL.search(alice.request("GET", f"/notifications/{row_id}").text)
    assert detail is not None
    assert detail[1] == cell

    revealed = alice.request("POST", f"/notifications/{row_id}/reveal", {"csrf": csrf}).text
    shown = _REVEALED.search(revealed)
    assert shown is not None
    assert re.fullmatch(r"c[123]@example\.com", shown[1])


def test_the_consoles_start_line_keeps_its_port(console: Console) -> None:
    assert f"Uvicorn running on http://127.0.0.1:{console.port} " in console.output()
