"""The console in a real browser (Debian's headless chromium, driven by Playwright), against a
real database, a real ``notifier console`` process and a real worker.

Screenshots go to the test's tmp folder, or to ``NOTIFIER_TEST_SCREENSHOTS`` when set.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from sqlalchemy import Engine, text

from tests.acceptance.conftest import Services, wait_for
from tests.browser import chromium, needs_chromium
from tests.console_server import HOSTILE, PASSWORDS, Console, console_env, seed

pytestmark = needs_chromium


@pytest.fixture
def console(database_url: str, tmp_path: Path) -> Iterator[Console]:
    server = Console(console_env(database_url), tmp_path / "console.log").start()
    yield server
    server.stop()


@pytest.fixture
def browser() -> Iterator[object]:
    with chromium() as b:
        yield b


def row(engine: Engine, row_id: int) -> tuple[str, int]:
    with engine.connect() as conn:
        status, attempts = conn.execute(
            text("SELECT status, attempts FROM notifications WHERE id = :id"), {"id": row_id}
        ).one()
    return str(status), int(attempts)


def log_in(browser: object, console: Console, user: str) -> object:
    # localhost: a browser keeps a Secure cookie for it over plain HTTP, as through a tunnel
    page = browser.new_page(viewport={"width": 1360, "height": 900})  # type: ignore[attr-defined]
    page.goto(f"http://localhost:{console.port}/")
    assert page.url.endswith("/login")
    page.fill("input[name=user]", user)
    page.fill("input[name=password]", PASSWORDS[user])
    page.click("button:has-text('Log in')")
    page.wait_for_url(f"http://localhost:{console.port}/")
    return page


def test_an_operator_finds_requeues_and_cancels_rows_in_the_browser(
    browser: object,
    console: Console,
    engine: Engine,
    services: Services,
    tmp_path: Path,
) -> None:
    shots = Path(os.environ.get("NOTIFIER_TEST_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    base = f"http://localhost:{console.port}"
    ids = seed(engine)
    services.worker()
    services.beat()  # a requeue is an UPDATE, which wakes no listener: beat's dispatch finds it
    with engine.begin() as conn:  # a little history for the chart
        conn.execute(
            text(
                "INSERT INTO notification_attempts (notification_id, attempt, at, worker, channel,"
                " outcome) SELECT :id, 1, now() - g * interval '50 seconds', 'w1@host', 'email',"
                " CASE WHEN g % 7 = 0 THEN 'retry' ELSE 'sent' END FROM generate_series(1, 70) g"
            ),
            {"id": ids["sent"]},
        )
    alerts: list[str] = []
    page = log_in(browser, console, "alice")
    page.on("dialog", lambda d: (alerts.append(d.message), d.dismiss()))

    # the overview, and its live counts arriving by themselves
    assert page.locator("table.counts").is_visible()
    page.wait_for_selector("[data-live][data-updated]")
    assert page.locator("[data-count='dead.null']").inner_text() == "1"
    page.screenshot(path=str(shots / "overview.png"), full_page=True)

    # filter by recipient: the URL carries no address, the list shows it masked
    page.click("header >> text=Notifications")
    page.fill("input[name=recipient]", "dead.person@example.com")
    page.click("button:has-text('Filter')")
    page.wait_for_url(re.compile(r"/notifications\?q="))
    assert "dead.person" not in page.url
    [cell] = page.locator("td.recipient").all_inner_texts()
    assert re.fullmatch(r"d\*\*\*@example\.com #[0-9a-f]{4}", cell)
    page.goto(f"{base}/notifications?status=dead")
    listed = page.locator("table.list td:first-child a").all_inner_texts()
    assert sorted(int(t) for t in listed) == [ids["dead"], ids["hostile"]]
    page.screenshot(path=str(shots / "list.png"), full_page=True)

    # a row full of markup is shown as text: no alert, no element of its own
    page.click(f"a:text-is('{ids['hostile']}')")
    page.wait_for_url(f"**/notifications/{ids['hostile']}")
    assert page.locator("pre.subject").inner_text() == HOSTILE
    assert page.locator("pre.body img").count() == 0
    assert page.evaluate("window.__xss") is None
    assert alerts == []

    # requeue the dead row; a real worker sends it
    page.goto(f"{base}/notifications/{ids['dead']}")
    page.click("text=Requeue…")
    page.fill("input[name=reason]", "provider fixed")
    page.screenshot(path=str(shots / "confirm.png"))
    page.click("button:has-text('Yes, requeue it')")
    page.wait_for_selector("text=Requeued.")
    wait_for(lambda: row(engine, ids["dead"])[0] == "sent", 60, "the requeued row to be sent")
    page.reload()
    outcomes = page.locator("table:last-of-type tbody tr td:nth-child(5)").all_inner_texts()
    workers = page.locator("table:last-of-type tbody tr td:nth-child(3)").all_inner_texts()
    assert outcomes[-2:] == ["requeued", "sent"]
    assert workers[-2] == "console:alice"
    page.screenshot(path=str(shots / "notification.png"), full_page=True)

    # cancel the pending one
    page.goto(f"{base}/notifications/{ids['pending']}")
    page.click("text=Cancel…")
    page.click("button:has-text('Yes, cancel it')")
    page.wait_for_selector("text=Cancelled.")
    assert row(engine, ids["pending"])[0] == "cancelled"

    # pause and resume the campaign
    page.click("header >> text=Campaigns")
    page.click("tr[data-campaign=spring] >> text=Pause…")
    page.click("button:has-text('Yes, pause it')")
    page.wait_for_selector("text=pause done")
    assert page.locator("tr[data-campaign=spring] td.status").inner_text() == "paused"
    page.click("tr[data-campaign=spring] >> text=Resume…")
    page.click("button:has-text('Yes, resume it')")
    page.wait_for_selector("text=resume done")
    assert page.locator("tr[data-campaign=spring] td.status").inner_text() == "running"
    page.screenshot(path=str(shots / "campaigns.png"), full_page=True)


def test_a_viewer_is_offered_no_action(browser: object, console: Console, engine: Engine) -> None:
    ids = seed(engine)
    page = log_in(browser, console, "bob")
    page.goto(f"http://localhost:{console.port}/notifications/{ids['dead']}")
    assert page.locator("h1").inner_text().startswith(f"Notification {ids['dead']}")
    assert page.locator("text=Requeue…").count() == 0
    page.goto(f"http://localhost:{console.port}/campaigns")
    assert page.locator("text=Pause…").count() == 0


def test_a_campaign_named_like_a_path_acts_on_that_campaign(
    browser: object, console: Console, engine: Engine
) -> None:
    ids = seed(engine)
    name = f"y/../../notifications/{ids['pending']}"
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO campaigns (name, channel, subject, status, launched_at)"
                " VALUES (:name, 'null', 'Tricky', 'running', now())"
            ),
            {"name": name},
        )
    page = log_in(browser, console, "alice")
    page.goto(f"http://localhost:{console.port}/campaigns")  # type: ignore[attr-defined]
    row_of = f'tr[data-campaign="{name}"]'
    page.click(f"{row_of} >> text=Cancel…")  # type: ignore[attr-defined]
    assert page.locator("h1").inner_text() == f"Cancel campaign {name}?"  # type: ignore[attr-defined]
    form = page.locator("form:has(button:has-text('Yes, cancel it'))")  # type: ignore[attr-defined]
    action = form.evaluate("f => f.action")  # as the browser resolved it
    assert action == f"http://localhost:{console.port}/campaigns/{quote(name, safe='')}/cancel"
    page.click("button:has-text('Yes, cancel it')")  # type: ignore[attr-defined]
    page.wait_for_selector("text=cancel done")  # type: ignore[attr-defined]
    with engine.connect() as conn:
        got = conn.execute(
            text("SELECT status FROM campaigns WHERE name = :name"), {"name": name}
        ).scalar_one()
    assert got == "cancelled"
    assert row(engine, ids["pending"])[0] == "pending"
