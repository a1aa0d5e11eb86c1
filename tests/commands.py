"""Running the ``notifier`` command in the test's own process, as an operator would."""

from __future__ import annotations

import io
import sys

import pytest

from notifier.cli.main import main


def run(capsys: pytest.CaptureFixture[str], *argv: str, stdin: str = "") -> tuple[int, str, str]:
    """``notifier ARGV`` in this process, ``stdin`` as its standard input: (exit status,
    stdout, stderr). Tests that use it also use the ``restore_logging`` fixture: the command
    sets up the process's logging."""
    capsys.readouterr()
    saved, sys.stdin = sys.stdin, io.StringIO(stdin)
    try:
        code = main(list(argv))
    finally:
        sys.stdin = saved
    out, err = capsys.readouterr()
    return code, out, err
