"""Every benchmark script starts: ``python bench/NAME.py --help`` exits 0.

``bench/email.py`` is named like the standard library's ``email`` package, and a script's own
folder comes first on the path: a script that imported anything before putting the repository
in its place would import that file instead of the package, and fail before its first line of
work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(
    p.name for p in (ROOT / "bench").glob("*.py") if 'if __name__ == "__main__":' in p.read_text()
)


def test_the_scripts_are_found() -> None:
    assert {"email.py", "webhook.py", "field.py"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_benchmark_script_starts(script: str) -> None:
    done = subprocess.run(
        [sys.executable, f"bench/{script}", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in done.stdout.lower()
