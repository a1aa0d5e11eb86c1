"""The preference center in a real browser (Debian's headless chromium, driven by Playwright),
served by a real ``notifier events`` process: found by its labels, used with the keyboard
alone, with JavaScript off, and saved into real PostgreSQL."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from notifier import client, unsubscribe
from notifier.db.templates import upsert_template
from tests.browser import chromium, needs_chromium
from tests.events_endpoint import SECRET, Endpoint, running_endpoint

pytestmark = needs_chromium


@pytest.fixture
def endpoint(database_url: str, redis_url: str, tmp_path: Path) -> Iterator[Endpoint]:
    with running_endpoint(database_url, redis_url, tmp_path) as ep:
        yield ep


@pytest.fixture
def browser() -> Iterator[object]:
    with chromium() as b:
        yield b


def focused(page: object) -> str:
    """The name of the control that has the keyboard's focus."""
    return str(page.evaluate("document.activeElement.name"))  # type: ignore[attr-defined]


def leave(page: object, field: str) -> None:
    """Tab out of a time field, through whatever segments it has left."""
    assert focused(page) == field
    for _ in range(3):
        page.keyboard.press("Tab")  # type: ignore[attr-defined]
        if focused(page) != field:
            return
    raise AssertionError(f"the keyboard cannot leave {field}")


def test_a_person_turns_a_category_off_and_sets_quiet_hours_with_the_keyboard_alone(
    browser: object, endpoint: Endpoint, engine: Engine, tmp_path: Path
) -> None:
    with engine.begin() as conn:
        client.upsert_profile(conn, "u-1", email="ann@example.com", time_zone="Europe/Vienna")
    url = f"{endpoint.url}/p/{unsubscribe.preferences_token(SECRET, 'u-1')}"
    context = browser.new_context(java_script_enabled=False)  # type: ignore[attr-defined]
    page = context.new_page()
    page.goto(url)

    # Every control is found by its label, as a screen reader announces it.
    marketing = page.get_by_role("group", name="Marketing")
    assert marketing.get_by_label("Email").is_checked()
    assert marketing.get_by_label("Text messages (SMS)").is_checked()
    assert not page.get_by_role("group", name="Digest").get_by_label("Email").is_checked()
    assert page.get_by_role("group", name="Security").get_by_label("Email").is_disabled()

    # Tab order is reading order: the first control is marketing's email box.
    page.keyboard.press("Tab")
    assert marketing.get_by_label("Email").evaluate("e => e === document.activeElement")
    page.keyboard.press("Space")  # marketing by email: off
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")  # digest by email (security's box is disabled: skipped)
    page.keyboard.press("Space")  # digest: on
    page.keyboard.press("Tab")
    # Typed as the browser shows a time field here: hours, minutes, AM/PM.
    page.keyboard.type("1000P")  # quiet hours from 22:00
    leave(page, "quiet_start")
    page.keyboard.type("0630A")  # until 06:30
    leave(page, "quiet_end")
    assert page.get_by_role("button", name="Save").evaluate("e => e === document.activeElement")
    with page.expect_navigation():
        page.keyboard.press("Enter")
    shots = Path(os.environ.get("NOTIFIER_TEST_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(shots / "preferences.png"), full_page=True)

    assert page.get_by_role("status").inner_text() == "Your choices are saved."
    assert not marketing.get_by_label("Email").is_checked()
    with engine.connect() as conn:
        chosen = conn.execute(
            text("SELECT category, channel, enabled, source FROM preferences ORDER BY 1, 2")
        ).all()
        quiet = conn.execute(text("SELECT quiet_start::text, quiet_end::text FROM profiles")).one()
    assert [tuple(r) for r in chosen] == [
        ("digest", "email", True, "person"),
        ("marketing", "email", False, "person"),
        ("marketing", "sms", True, "person"),
    ]
    assert tuple(quiet) == ("22:00:00", "06:30:00")
    context.close()


def test_the_page_is_in_the_persons_language(
    browser: object, endpoint: Endpoint, engine: Engine
) -> None:
    with engine.begin() as conn:
        client.upsert_profile(conn, "u-2", locale="de-AT")
        upsert_template(conn, "preferences", "page", "de", ("Ihre Einstellungen", "Hallo", None))
        upsert_template(conn, "category.marketing", "page", "de", ("Angebote", None, None))
        upsert_template(conn, "channel.email", "page", "de", ("E-Mail", None, None))
    page = browser.new_page()  # type: ignore[attr-defined]
    page.goto(f"{endpoint.url}/p/{unsubscribe.preferences_token(SECRET, 'u-2')}")

    assert page.title() == "Ihre Einstellungen"
    assert page.locator("html").get_attribute("lang") == "de"
    assert page.get_by_role("group", name="Angebote").get_by_label("E-Mail").is_checked()
