"""The ``notifier`` command as a whole: ``--json`` on every command that prints, progress bars
only on a terminal's stderr, ``--version``, shell completion and the help operators read."""

from __future__ import annotations

import io
import json
import os
import pty
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import click
import pytest
from sqlalchemy import Engine, text

import notifier
from notifier.campaigns import Campaigns
from notifier.cli.main import cli, main
from tests.commands import run
from tests.server_process import free_port

#: The console script, as operators run it (installed beside this Python).
NOTIFIER = str(Path(sys.executable).with_name("notifier"))
#: What a progress bar draws: click's bar redraws its line with a carriage return.
BAR_MARKS = ("\r", "\x1b[?25l", "writing", "reading", "sending")


# The commands set up logging for the process; each test puts the test session's back.
pytestmark = pytest.mark.usefixtures("restore_logging")


def _notifier(
    *argv: str, stderr: int | None = subprocess.PIPE, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [NOTIFIER, *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def world(engine: Engine, database_url: str, tmp_path: Path) -> dict[str, str]:
    """One of everything the commands act on: a waiting row with a key, a campaign with an
    audience and codes, a template, a suppression; and files to import."""
    with engine.begin() as conn:
        row = notifier.enqueue(conn, channel="null", to="x", subject="hi", key="k1")
    campaigns = Campaigns(engine)
    campaigns.create("spring", "null", subject="Hi {name}", body="Your code: {code}")
    audience = io.StringIO("email,name\na@example.com,A\nb@example.com,B\n")
    campaigns.import_audience("spring", audience, "email")
    campaigns.generate_codes("spring", 2)
    assert main(["template", "add", "welcome", "--channel", "email", "--body", "Hi"]) == 0
    assert main(["suppress", "add", "--channel", "email", "a@example.com"]) == 0
    (tmp_path / "more.csv").write_text("recipient\nc@example.com\n", encoding="utf-8")
    (tmp_path / "codes.txt").write_text("C1\nC2\n", encoding="utf-8")
    return {
        "id": str(row.id),
        "csv": str(tmp_path / "more.csv"),
        "codes": str(tmp_path / "codes.txt"),
    }


# Each printing command, and what runs before it (a campaign is resumed once it is paused).
PRINTING: list[tuple[list[str], list[list[str]]]] = [
    (["send", "--channel", "null", "--to", "y", "--key", "k2"], []),
    (["send", "--channel", "null", "--to", "y", "--key", "k1"], []),  # already queued
    (["show", "{id}"], []),
    (["stats"], []),
    (["cancel", "k1"], []),
    (["cancel", "--id", "{id}", "--id", "999999"], []),
    (["cancel", "--channel", "null", "--yes"], []),
    (["cancel", "--channel", "null", "--dry-run"], []),
    (["requeue", "--all"], []),
    (["purge"], []),
    (["purge", "--dry-run"], []),
    (["health"], []),
    (["migrate"], []),
    (["campaign", "create", "autumn", "--channel", "null", "--body", "hi"], []),
    (["campaign", "audience", "spring", "--csv", "{csv}"], []),
    (["campaign", "codes", "spring", "--file", "{codes}"], []),
    (["campaign", "codes", "spring", "--generate", "3"], []),
    (["campaign", "launch", "spring", "--no-watch"], []),
    (["campaign", "status", "spring"], []),
    (["campaign", "status", "spring", "--watch"], []),  # nothing launched: nothing to wait for
    (["campaign", "pause", "spring"], [["campaign", "launch", "spring", "--no-watch"]]),
    (
        ["campaign", "resume", "spring"],
        [["campaign", "launch", "spring", "--no-watch"], ["campaign", "pause", "spring"]],
    ),
    (["campaign", "cancel", "spring"], []),
    (["campaign", "failures", "spring"], []),
    (["template", "add", "hello", "--channel", "email", "--subject", "Hi {{ name }}"], []),
    (["template", "list"], []),
    (["template", "show", "welcome"], []),
    (["template", "show", "nothing"], []),
    (["template", "rm", "welcome", "--channel", "email", "--locale", "en"], []),
    (["suppress", "add", "--channel", "email", "b@example.com"], []),
    (["suppress", "add", "--channel", "email", "a@example.com"], []),  # already there
    (["suppress", "list"], []),
    (["suppress", "rm", "--channel", "email", "a@example.com"], []),
    (["profile", "set", "u-1", "--email", "a@example.com", "--field", "first_name=Ann"], []),
    (["profile", "show", "u-1"], [["profile", "set", "u-1", "--email", "a@example.com"]]),
    (
        ["profile", "prefer", "u-1", "marketing", "email", "off"],
        [["profile", "set", "u-1", "--email", "a@example.com"]],
    ),
    (["console", "hash-password"], []),
    (["api-key", "create", "shop", "--channel", "email"], []),
    (["api-key", "list"], [["api-key", "create", "shop"]]),
    (["api-key", "revoke", "nk_aaaaaaaaaa"], []),  # none such: exit 1
]


@pytest.mark.parametrize(("argv", "before"), PRINTING, ids=[" ".join(argv) for argv, _ in PRINTING])
def test_json_is_one_document_with_the_status_of_the_table(
    world: dict[str, str],
    redis_url: str,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    before: list[list[str]],
) -> None:
    for step in before:
        assert main(step) == 0, step
    args = [a.format(**world) for a in argv]
    code, out, err = run(capsys, *args, "--json", stdin="pw\n")
    assert code in (0, 1), err
    assert out.endswith("\n"), out
    assert out.count("\n") == 1, out
    assert json.loads(out) is not None


def test_json_holds_the_rows_of_the_table(
    world: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["suppress", "add", "--channel", "sms", "+14155550100"]) == 0
    for argv, header in (
        (["suppress", "list"], "SINCE"),
        (["template", "list"], "NAME"),
    ):
        code, table, _ = run(capsys, *argv)
        _, out, _ = run(capsys, *argv, "--json")
        lines = table.splitlines()
        assert (code, lines[0].split()[0]) == (0, header)
        assert len(json.loads(out)) == len(lines) - 1
    code, table, _ = run(capsys, "stats")
    _, out, _ = run(capsys, "stats", "--json")
    counts = json.loads(out)["by_status_channel"]
    assert counts == [{"status": "pending", "channel": "null", "count": 1}]
    assert table.splitlines()[1].split() == ["pending", "null", "1"]


def _leaves(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, click.Command]]:
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _leaves(command, (*path, name))
        else:
            yield " ".join((*path, name)), command


def test_every_command_that_prints_takes_json_and_every_option_has_help() -> None:
    servers = {"metrics", "events", "api"}  # they serve until stopped: nothing of their own
    leaves = dict(_leaves(cli))
    assert {name.split()[0] for name in leaves} >= {
        "send", "show", "stats", "cancel", "requeue", "purge", "health", "migrate",
        "campaign", "template", "suppress", "console", "metrics", "events",
    }  # fmt: skip
    for name, command in leaves.items():
        options = {o for p in command.params for o in p.opts}
        assert ("--json" in options) == (name not in servers), name
        assert command.help, name
        assert command.short_help, name
        for param in command.params:
            if isinstance(param, click.Option):
                assert param.help, f"{name} {param.opts[0]}"
    exercised = {
        " ".join(argv[:2])
        if argv[0] in ("campaign", "template", "suppress", "profile", "api-key")
        else argv[0]
        for argv, _ in PRINTING
    }
    assert exercised == set(leaves) - servers


# --- progress ---------------------------------------------------------------------------------


def _launchable(engine: Engine, name: str) -> str:
    """A campaign of 2,000 recipients with their codes, ready to launch."""
    campaigns = Campaigns(engine)
    campaigns.create(name, "null", body="Your code: {code}")
    rows = "".join(f"u{i}@example.com\n" for i in range(2_000))
    campaigns.import_audience(name, io.StringIO("recipient\n" + rows))
    campaigns.generate_codes(name, 2_000)
    return name


def _on_a_terminal(*argv: str) -> tuple[int, str, str]:
    """Run the console script with stderr on a pseudo-terminal: (status, stdout, stderr)."""
    leader, follower = pty.openpty()
    try:
        process = _notifier(*argv, stderr=follower)
    finally:
        os.close(follower)
    drawn = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: every writer has closed the terminal
            break
        if not chunk:
            break
        drawn += chunk
    os.close(leader)
    out, _ = process.communicate(timeout=60)
    return process.returncode, out.decode(), drawn.decode(errors="replace")


def test_a_launch_draws_progress_on_a_terminals_stderr_only(
    engine: Engine, database_url: str
) -> None:
    code, out, err = _on_a_terminal("campaign", "launch", _launchable(engine, "big"), "--no-watch")
    assert (code, out) == (0, "campaign 'big': 2000 notifications written\n")
    assert "writing" in err
    assert "2000/2000" in err
    assert "100%" in err


def test_no_progress_in_a_pipe_or_with_json(engine: Engine, database_url: str) -> None:
    piped = _notifier("campaign", "launch", _launchable(engine, "big"), "--no-watch")
    out, err = piped.communicate(timeout=60)
    assert (piped.returncode, out.decode()) == (0, "campaign 'big': 2000 notifications written\n")
    assert not [mark for mark in BAR_MARKS if mark in err.decode()], err

    other = _launchable(engine, "other")
    code, out, err = _on_a_terminal("campaign", "launch", other, "--no-watch", "--json")
    assert code == 0
    assert json.loads(out) == {"name": "other", "written": 2000}
    assert not [mark for mark in BAR_MARKS if mark in err], err


def test_an_import_shows_how_much_of_the_file_is_read(
    engine: Engine, database_url: str, tmp_path: Path
) -> None:
    Campaigns(engine).create("csv", "null", body="hi")
    audience = tmp_path / "audience.csv"
    audience.write_text("recipient\n" + "".join(f"u{i}@example.com\n" for i in range(5_000)))
    code, out, err = _on_a_terminal("campaign", "audience", "csv", "--csv", str(audience))
    assert (code, out) == (0, "5000 recipients added\n")
    assert "reading" in err
    assert "100%" in err
    piped = _notifier("campaign", "audience", "csv", "--csv", str(audience))
    out_bytes, err_bytes = piped.communicate(timeout=60)
    assert out_bytes.decode() == "0 recipients added\n"
    assert not [mark for mark in BAR_MARKS if mark in err_bytes.decode()]


# --- a closed pipe, the version, completion, help -------------------------------------------


@pytest.mark.parametrize("argv", [["stats"], ["suppress", "list", "--limit", "20000"]])
def test_a_reader_that_stops_early_ends_the_command_quietly(
    engine: Engine, database_url: str, argv: list[str]
) -> None:
    with engine.begin() as conn:  # far more than a pipe holds
        conn.execute(
            text(
                "INSERT INTO suppressions (channel, recipient, reason)"
                " SELECT 'email', 'u' || g || '@example.com', 'test'"
                " FROM generate_series(1, 20000) g"
            )
        )
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", '"$@" | head -1', "notifier", NOTIFIER, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert len(done.stdout.splitlines()) == 1


def test_version_of_the_console_script() -> None:
    done = subprocess.run([NOTIFIER, "--version"], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, f"notifier {metadata.version('notifier')}\n")


@pytest.mark.parametrize(
    ("shell", "says"),
    [
        ("bash", "complete -o nosort -F _notifier_completion notifier"),
        ("zsh", "#compdef notifier"),
        ("fish", "complete --no-files --command notifier"),
    ],
)
def test_completion_scripts_come_from_the_command(shell: str, says: str) -> None:
    done = subprocess.run(
        [NOTIFIER],
        env={**os.environ, "_NOTIFIER_COMPLETE": f"{shell}_source"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert says in done.stdout
    assert "_NOTIFIER_COMPLETE" in done.stdout


def test_completion_offers_commands_and_choices() -> None:
    def complete(words: str) -> list[str]:
        done = subprocess.run(
            [NOTIFIER],
            env={
                **os.environ,
                "_NOTIFIER_COMPLETE": "bash_complete",
                "COMP_WORDS": words,
                "COMP_CWORD": str(len(words.split(" ")) - 1),
            },
            capture_output=True,
            text=True,
            timeout=60,
        )
        return done.stdout.splitlines()

    assert complete("notifier cam") == ["plain,campaign"]
    assert complete("notifier campaign la") == ["plain,launch"]
    assert complete("notifier cancel --status ") == ["plain,pending", "plain,processing"]


def test_help_is_for_operators(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("Usage: notifier [OPTIONS] COMMAND [ARGS]...")
    assert "notifier delivers the notifications" in shown
    for name in cli.commands:
        assert f"\n  {name} " in shown, name
    for section in ("Notifications:", "Campaigns and content:", "Running notifier:"):
        assert f"\n{section}\n" in shown
    for internal in ("``", "notifier.cli", "argparse", "live beside it", "module"):
        assert internal not in shown
    assert main(["-h"]) == 0
    assert capsys.readouterr().out == shown


def test_a_campaign_names_a_stored_template_and_reports_repeated_csv_lines(
    capsys: pytest.CaptureFixture[str], engine: Engine, tmp_path: Path
) -> None:
    assert main(["template", "add", "gift", "--channel", "null", "--body", "Hi {{ name }}"]) == 0
    code, out, _ = run(
        capsys, "campaign", "create", "gift", "--channel", "null", "--template", "gift"
    )
    assert code == 0, out
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT template FROM campaigns WHERE name = 'gift'")).one()
    assert tuple(stored) == ("gift",)
    code, _, err = run(
        capsys,
        "campaign",
        "create",
        "both",
        "--channel",
        "null",
        "--template",
        "gift",
        "--subject",
        "x",
    )
    assert code == 2
    assert "template" in err

    csv = tmp_path / "repeats.csv"
    csv.write_text("email,name\na@x.org,A\nb@x.org,B\na@x.org,again\n", encoding="utf-8")
    code, out, _ = run(
        capsys, "campaign", "audience", "gift", "--csv", str(csv), "--recipient-column", "email"
    )
    assert code == 0
    assert (
        "2 recipients added; 1 repeated lines skipped (line 4: 'a@x.org', first on line 2)" in out
    )
    code, out, _ = run(
        capsys,
        "campaign",
        "audience",
        "gift",
        "--csv",
        str(csv),
        "--recipient-column",
        "email",
        "--json",
    )
    assert json.loads(out)["duplicates"] == 1

    campaigns = Campaigns(engine)
    campaigns.create("strict", "null", subject="s", body="b")
    code, _, err = run(
        capsys,
        "campaign",
        "audience",
        "strict",
        "--csv",
        str(csv),
        "--recipient-column",
        "email",
        "--on-duplicate",
        "refuse",
    )
    assert code == 2
    assert "line 4 repeats 'a@x.org' from line 2" in err
    assert campaigns.status("strict").counts.recipients == 0


def test_the_api_will_not_start_with_providers_it_cannot_load(database_url: str) -> None:
    # It loads the checks every written row passes before it serves: a wrong setting stops it
    # with the reason, rather than leaving it up to refuse every write.
    env = {"NOTIFIER_DATABASE_URL": database_url, "NOTIFIER_FAILOVER": "email=email,smtp2"}
    proc = _notifier("api", f"--port={free_port()}", env=env)
    try:
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 2
    assert "NOTIFIER_FAILOVER names providers that are not installed: smtp2" in stderr.decode()
