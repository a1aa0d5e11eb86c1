"""Row text printed by the real ``notifier`` command cannot drive the operator's terminal."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from notifier.cli import terminal
from tests.conftest import POSTGRES
from tests.factories import MakeRow

HOSTILE = "a\x1b[2Jb\x1b]0;title\x07c\rd\u202ee\x9bf\x7f"
#: What a terminal would act on; a newline only ends the command's own lines.
ACTED_ON = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _notifier(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "notifier.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=None if env is None else {**os.environ, **env},
    )


@pytest.fixture
def row(engine: Engine, raw_row: MakeRow) -> int:
    row_id = raw_row(
        **dict.fromkeys(("channel", "recipient", "subject", "body", "dedupe_key"), HOSTILE),
        status="dead",
        attempts=1,
        last_error=HOSTILE,
        payload={"k": HOSTILE},
    )
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO notification_attempts"
                " (notification_id, attempt, worker, channel, outcome, error)"
                " VALUES (:id, 1, :v, :v, 'dead', :v)"
            ),
            {"id": row_id, "v": HOSTILE},
        )
    return row_id


@pytest.mark.timeout(120)
@pytest.mark.parametrize("json_output", [False, True], ids=["table", "json"])
def test_show_and_stats_spell_out_escape_sequences(row: int, json_output: bool) -> None:
    extra = ["--json"] if json_output else []
    for argv in (["show", str(row), *extra], ["stats", *extra]):
        done = _notifier(*argv)
        assert done.returncode == 0, done.stderr
        assert not ACTED_ON.findall(done.stdout), argv
        if json_output:
            assert HOSTILE in _strings(json.loads(done.stdout))  # the data itself is intact
        else:
            assert "a\\x1b[2Jb\\x1b]0;title\\x07c\\rd\\u202ee\\x9bf\\x7f" in done.stdout
    shown = _notifier("show", str(row)).stdout
    for field in ("recipient", "subject", "body", "last_error", "dedupe_key"):
        assert re.search(rf"^  {field} +a\\x1b\[2J", shown, re.MULTILINE), field


def _strings(data: object) -> list[str]:
    if isinstance(data, dict):
        return [s for v in data.values() for s in _strings(v)]
    if isinstance(data, list):
        return [s for v in data for s in _strings(v)]
    return [data] if isinstance(data, str) else []


def test_text_printed_any_other_way_keeps_its_lines_but_not_its_escapes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with terminal.guarded():
        print(f"campaign {HOSTILE}\n\tnext")
    assert capsys.readouterr().out == (
        "campaign a\\x1b[2Jb\\x1b]0;title\\x07c\\rd\\u202ee\\x9bf\\x7f\n\tnext\n"
    )


def test_a_missing_database_is_one_line_naming_the_setting_and_the_fix() -> None:
    done = _notifier("stats", env={"NOTIFIER_DATABASE_URL": f"{POSTGRES}/notifer_missing"})
    assert (done.returncode, done.stdout) == (5, "")
    assert done.stderr.splitlines() == [
        "notifier: database 'notifer_missing' does not exist on"
        f" {make_url(POSTGRES).host}:{make_url(POSTGRES).port or 5432} (NOTIFIER_DATABASE_URL):"
        " correct the name, or create it with `notifier migrate`"
    ]


def test_an_unreachable_database_is_one_line_naming_the_setting() -> None:
    with socket.socket() as closed:  # a port nothing listens on: bound, never listening
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/notifier"
        done = _notifier("stats", env={"NOTIFIER_DATABASE_URL": url})
    assert (done.returncode, done.stdout) == (4, "")
    [line] = done.stderr.splitlines()
    assert line.startswith(
        f"notifier: cannot reach PostgreSQL at 127.0.0.1:{port} (NOTIFIER_DATABASE_URL): "
    )
    assert "Traceback" not in done.stderr
