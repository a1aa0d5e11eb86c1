"""Operators' reads survive any time a row can hold: ``±infinity``, 4713 BC, 294276 AD.

PostgreSQL stores times Python cannot (``notifier.db.engine`` reads them as ``datetime.max`` and
``datetime.min``) and refuses to subtract infinite ones. Every read an operator or a monitor
makes (``notifier health``, ``stats``, ``stats --json``, ``show``, the metrics' gauges, the
console's pages and live numbers) must treat such a time as a value: one row written so must
never make monitoring blind for as long as it waits.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy import Engine, text

from notifier import health, metrics
from notifier.providers import load_registry
from notifier.settings import Settings, get_settings
from tests.commands import run
from tests.console_server import PASSWORDS, Client, Console, console_env
from tests.factories import MakeSettings
from tests.prometheus import samples, scrape

#: What PostgreSQL takes that Python's ``datetime`` cannot hold, and now.
EXTREMES = (
    "infinity",
    "-infinity",
    "294276-12-31 23:59:59+00",
    "4713-01-01 00:00:00+00 BC",
    "0001-01-01 00:00:00+00",
    "9999-12-31 23:59:59.999999+00",
    "now",
)
#: A sane age: within this many years either way (the reads clamp times to a century from now).
YEARS = 101

pytestmark = pytest.mark.usefixtures("restore_logging")


def _year(y: int) -> str:
    return f"{y:04d}-06-15 12:34:56+00" if y > 0 else f"{1 - y:04d}-06-15 12:34:56+00 BC"


times = st.one_of(
    st.sampled_from(EXTREMES),
    st.integers(-4712, 294275).map(_year),
    st.datetimes(timezones=st.just(UTC)).map(lambda d: d.isoformat()),
)


@pytest.fixture
def console(database_url: str, tmp_path: Path) -> Iterator[Console]:
    server = Console(console_env(database_url), tmp_path / "console.log").start()
    yield server
    server.stop()


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def _insert_everywhere(engine: Engine, at: dict[str, str]) -> list[int]:
    """A notification in every status, a campaign, attempts and status events, their times
    from ``at`` (by column; ``now()`` for the rest); the notifications' ids."""
    t = {k: at.get(k, "now") for k in _COLUMNS}
    with engine.begin() as conn:
        conn.execute(
            text(
                "TRUNCATE notifications, notification_attempts, status_events, campaigns"
                " RESTART IDENTITY CASCADE"
            )
        )
        campaign = conn.execute(
            text(
                "INSERT INTO campaigns (name, channel, subject, status, created_at, launched_at,"
                " updated_at) VALUES ('far', 'null', 'Far', 'running', CAST(:c_created AS"
                " timestamptz), CAST(:c_launched AS timestamptz), CAST(:c_updated AS timestamptz))"
                " RETURNING id"
            ),
            t,
        ).scalar_one()
        ids = [
            conn.execute(
                text(
                    "INSERT INTO notifications (channel, recipient, status, campaign_id,"
                    " next_attempt_at, expires_at, created_at, updated_at, locked_until,"
                    " claim_token, sent_at, delivery_status, delivery_at, last_error)"
                    " VALUES ('null', :status, :status, :campaign, CAST(:next_attempt_at AS"
                    " timestamptz), CAST(:expires_at AS timestamptz), CAST(:created_at AS"
                    " timestamptz), CAST(:updated_at AS timestamptz), CAST(:locked_until AS"
                    " timestamptz), gen_random_uuid(),"
                    " CASE WHEN :status = 'sent' THEN CAST(:sent_at AS timestamptz) END,"
                    " CASE WHEN :status = 'sent' THEN 'delivered' END,"
                    " CASE WHEN :status = 'sent' THEN CAST(:delivery_at AS timestamptz) END,"
                    " CASE WHEN :status IN ('dead', 'cancelled') THEN 'gave up' END)"
                    " RETURNING id"
                ),
                {**t, "status": status, "campaign": campaign},
            ).scalar_one()
            for status in ("pending", "processing", "sent", "dead", "cancelled")
        ]
        conn.execute(
            text(
                "INSERT INTO notification_attempts (notification_id, attempt, at, worker,"
                " channel, outcome, error, duration_ms) SELECT id, 1, CAST(:attempt_at AS"
                " timestamptz), 'w1:1', 'null', 'retry', 'boom', 5 FROM notifications"
            ),
            t,
        )
        conn.execute(
            text(
                "INSERT INTO status_events (notification_id, kind, state, channel, occurred_at,"
                " status, next_attempt_at, claim_token, locked_until, last_error, created_at,"
                " updated_at) SELECT :first, 'status', 'sent', 'null', CAST(:e_occurred AS"
                " timestamptz), s, CAST(:e_next AS timestamptz), gen_random_uuid(),"
                " CAST(:e_locked AS timestamptz), 'boom', CAST(:e_created AS timestamptz),"
                " CAST(:e_updated AS timestamptz)"
                " FROM unnest(ARRAY['pending', 'processing', 'dead']) s"
            ),
            {**t, "first": ids[0]},
        )
    return ids


#: Every time column an operator's read may meet, by the name ``_insert_everywhere`` binds.
_COLUMNS = (
    "next_attempt_at",
    "expires_at",
    "created_at",
    "updated_at",
    "locked_until",
    "sent_at",
    "delivery_at",
    "attempt_at",
    "c_created",
    "c_launched",
    "c_updated",
    "e_occurred",
    "e_next",
    "e_locked",
    "e_created",
    "e_updated",
)


def _sane_age(value: object) -> None:
    assert isinstance(value, int | float), value
    assert math.isfinite(value), value
    assert abs(value) <= YEARS * 366 * 86400, value


def _gauges(engine: Engine, client: redis.Redis) -> dict[str, float]:
    """The metrics endpoint's exposition, from the collector it serves."""
    registry = CollectorRegistry()
    registry.register(metrics.NotifierCollector(engine, client, metrics.Labels.of(_registry())))
    found = samples(generate_latest(registry).decode())
    return {name: value for (name, labels), value in found.items() if not labels}


def _registry() -> Any:
    return load_registry(get_settings())


def _read_everything(
    engine: Engine,
    client: redis.Redis,
    quick: Settings,
    capsys: pytest.CaptureFixture[str],
    web: Client,
    ids: list[int],
) -> None:
    checks = health.check(engine, client, quick)
    database = next(c for c in checks if c.name == "database")
    assert database.ok, database.detail
    code, out, err = run(capsys, "health")
    assert code in (0, 1), (out, err)
    assert "unreachable" not in out, out

    code, out, err = run(capsys, "stats")
    assert code == 0, err
    assert "due now: " in out
    code, out, err = run(capsys, "stats", "--json")
    assert code == 0, err
    stats = json.loads(out)
    _sane_age(stats["lag_seconds"])
    _sane_age(stats["status_events"]["oldest_pending_seconds"])
    assert stats["due"] in (0, 1)
    if not stats["due"]:  # no due row has waited at all, whatever the other rows hold
        assert stats["lag_seconds"] == 0.0

    gauges = _gauges(engine, client)
    for name in ("notifier_due", "notifier_lag_seconds", "notifier_status_events_oldest_seconds"):
        assert name in gauges, sorted(gauges)
        _sane_age(gauges[name])

    for row_id in ids:
        code, out, err = run(capsys, "show", str(row_id))
        assert (code, f"notification {row_id}") == (0, out.splitlines()[0]), err
        code, out, err = run(capsys, "show", str(row_id), "--json")
        assert code == 0, err
        assert json.loads(out)["notification"]["id"] == row_id

    pages = ["/", "/notifications", "/notifications?status=pending", "/campaigns"]
    pages += [f"/notifications/{i}" for i in ids]
    for path in pages:
        r = web.request("GET", path)
        assert r.status_code == 200, (path, r.status_code, r.text[-500:])
    live = web.request("GET", "/live.json")
    assert live.status_code == 200, live.text
    numbers = live.json()
    assert numbers["due"] == stats["due"]
    if numbers["due"]:
        _sane_age(numbers["lag_seconds"])
    else:
        assert numbers["lag_seconds"] is None


def _logged_in(console: Console) -> Client:
    """bob's session, without reading a page first (``Client.login`` reads the overview)."""
    web = console.client()
    token = re.search(r'name="login_token" value="([^"]+)"', web.request("GET", "/login").text)
    assert token is not None
    form = {"login_token": token[1], "user": "bob", "password": PASSWORDS["bob"]}
    assert web.request("POST", "/login", form).status_code == 303
    return web


@pytest.fixture
def quick(make_settings: MakeSettings) -> Settings:
    return make_settings(dispatch_interval=1.0, task_soft_time_limit=1.0)


def test_one_row_at_minus_infinity_blinds_no_monitor(
    engine: Engine,
    client: redis.Redis,
    quick: Settings,
    console: Console,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The reported row: pending, due since ``-infinity``. Health says the database answers
    and how long the row has waited (a clamped age, not an error); stats, metrics and the
    console show it like any other."""
    ids = _insert_everywhere(engine, {"next_attempt_at": "-infinity"})
    web = _logged_in(console)
    _read_everything(engine, client, quick, capsys, web, ids)

    code, out, _ = run(capsys, "health")
    assert re.search(r"ok +database +1 rows due, lag \d+\.\ds", out), out
    assert code == 1  # nobody claims the waiting row: the claims check says so
    assert re.search(r"FAIL +claims", out), out
    body = scrape(engine, client, metrics.Labels.of(_registry()))
    found = samples(body)
    assert found[("notifier_due", ())] == 1
    assert found[("notifier_lag_seconds", ())] >= 99 * 365 * 86400


@pytest.mark.timeout(300)
@settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(at=st.fixed_dictionaries({}, optional=dict.fromkeys(_COLUMNS, times)))
def test_every_read_survives_any_time_in_any_column(
    at: dict[str, str],
    engine: Engine,
    client: redis.Redis,
    quick: Settings,
    console: Console,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ids = _insert_everywhere(engine, at)
    web = _logged_in(console)
    _read_everything(engine, client, quick, capsys, web, ids)


def test_times_python_cannot_hold_are_shown_as_the_ends_of_its_range(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = _insert_everywhere(engine, {"expires_at": "infinity", "created_at": "4713-01-01 BC"})
    code, out, _ = run(capsys, "show", str(ids[0]), "--json")
    assert code == 0
    row = json.loads(out)["notification"]
    assert datetime.fromisoformat(row["expires_at"]) == datetime.max.replace(tzinfo=UTC)
    assert datetime.fromisoformat(row["created_at"]) == datetime.min.replace(tzinfo=UTC)
