"""A real headless browser for the tests of pages: Debian's chromium driven by Playwright
(nothing may download a browser of its own)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"

#: Marks a module whose tests need the browser; CI installs it (.ci/run), so there they run.
needs_chromium = pytest.mark.skipif(
    shutil.which(CHROMIUM) is None and not os.environ.get("CI"),
    reason="needs Debian's chromium (apt-get install chromium chromium-driver; .ci/run does)",
)


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless chromium, closed afterwards (``--no-sandbox``: tests run as root)."""
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()
