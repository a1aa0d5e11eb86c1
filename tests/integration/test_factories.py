"""The tests' own row factories and environment, which every other test trusts."""

from __future__ import annotations

import os

import pytest
from sqlalchemy import Engine, text

from notifier.settings import Settings, get_settings
from tests.factories import MakeRow, MakeRows, SetEnv, ago, environment


def _row(engine: Engine, row_id: int, columns: str) -> tuple[object, ...]:
    with engine.connect() as conn:
        return tuple(
            conn.execute(
                text(f"SELECT {columns} FROM notifications WHERE id = :id"), {"id": row_id}
            ).one()
        )


def test_a_made_row_is_what_a_producer_enqueues(engine: Engine, make_row: MakeRow) -> None:
    row_id = make_row(channel="email", recipient="ann@example.com", payload={"a": 1})
    assert _row(
        engine, row_id, "channel, recipient, payload, status, attempts, max_attempts, priority"
    ) == ("email", "ann@example.com", {"a": 1}, "pending", 0, 5, 0)


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ("sent", ("sent", 0, None, True, False)),
        ("processing", ("processing", 0, None, False, True)),
        ("dead", ("dead", 5, "boom", False, False)),
        ("cancelled", ("cancelled", 0, None, False, False)),
    ],
)
def test_a_made_row_in_a_state_has_what_the_schema_asks_of_it(
    engine: Engine, make_row: MakeRow, status: str, expected: tuple[object, ...]
) -> None:
    row_id = make_row(status=status)
    assert (
        _row(
            engine,
            row_id,
            "status, attempts, last_error, sent_at IS NOT NULL,"
            " claim_token IS NOT NULL AND locked_until > now()",
        )
        == expected
    )


def test_columns_a_test_gives_win_over_the_states_own(engine: Engine, make_row: MakeRow) -> None:
    finished = ago(days=3)
    sent = make_row(status="sent", updated_at=finished)
    dead = make_row(status="dead", attempts=2, last_error="550 no such user")
    assert _row(engine, sent, "sent_at = updated_at, updated_at < now() - interval '2 days'") == (
        True,
        True,
    )
    assert _row(engine, dead, "attempts, last_error") == (2, "550 no such user")


def test_made_rows_take_a_column_per_row_and_a_key_only_once(
    engine: Engine, make_row: MakeRow, make_rows: MakeRows
) -> None:
    ids = make_rows(3, recipient=lambda i: f"u{i}", dedupe_key=lambda i: f"k{i}")
    assert [_row(engine, i, "recipient, dedupe_key") for i in ids] == [
        ("u1", "k1"),
        ("u2", "k2"),
        ("u3", "k3"),
    ]
    with pytest.raises(ValueError, match="a row with dedupe key 'k2' already exists"):
        make_row(dedupe_key="k2")


def test_a_raw_row_stores_what_no_producer_would(engine: Engine, raw_row: MakeRow) -> None:
    row_id = raw_row(payload="[1, 2]", expires_at="-infinity")
    assert _row(engine, row_id, "payload, expires_at::text") == ([1, 2], "-infinity")


def test_the_environment_is_what_get_settings_reads_and_is_restored_after(
    set_env: SetEnv,
) -> None:
    set_env(batch_size=11, webhook_allow_http=None)  # what the environment held before
    with pytest.MonkeyPatch.context() as patch, environment(patch) as inner:
        assert get_settings().batch_size == 11
        inner(batch_size=17)
        assert get_settings().batch_size == 17
        inner(batch_size=None)
        assert "NOTIFIER_BATCH_SIZE" not in os.environ
        assert get_settings().batch_size == Settings.model_fields["batch_size"].default
        inner(batch_size=3, webhook_allow_http=True)
        assert (get_settings().batch_size, os.environ["NOTIFIER_WEBHOOK_ALLOW_HTTP"]) == (3, "true")
    assert os.environ["NOTIFIER_BATCH_SIZE"] == "11"
    assert "NOTIFIER_WEBHOOK_ALLOW_HTTP" not in os.environ
    assert get_settings().batch_size == 11
