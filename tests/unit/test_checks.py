"""The checks every row gets whatever its channel (``notifier.delivery.checks``)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from notifier.delivery.checks import MAX_RECIPIENT_LENGTH, check_common, payload_size
from notifier.models import Notification
from notifier.providers import InvalidNotification
from notifier.settings import Settings
from tests.factories import SetEnv


def _n(recipient: str = "ada@example.com", payload: Any = None) -> Notification:
    return Notification(
        id=1,
        channel="email",
        recipient=recipient,
        subject="Hi",
        body="Hello",
        payload={} if payload is None else payload,
        attempts=1,
        max_attempts=5,
        claim_token=uuid.uuid4(),
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
    )


def _settings(limit: int) -> Settings:
    return Settings(max_payload_bytes=limit)


def test_payload_size_is_compact_utf8_json() -> None:
    assert payload_size({}) == 2
    assert payload_size({"a": [1, 2]}) == len('{"a":[1,2]}')
    assert payload_size({"name": "Zoë"}) == len('{"name":"Zoë"}'.encode())  # ë is two bytes


def test_a_payload_at_the_limit_passes_and_one_byte_more_does_not() -> None:
    payload = {"html": "x" * 100}
    size = payload_size(payload)
    check_common(_n(payload=payload), _settings(size))
    with pytest.raises(InvalidNotification) as refused:
        check_common(_n(payload=payload), _settings(size - 1))
    assert str(refused.value) == (
        f"payload is {size} bytes as JSON; at most {size - 1} allowed "
        "(NOTIFIER_MAX_PAYLOAD_BYTES): send a link or an id to the data instead of the data"
    )


def test_multibyte_characters_count_as_bytes() -> None:
    with pytest.raises(InvalidNotification, match="payload is 26 bytes as JSON; at most 25"):
        check_common(_n(payload={"t": "ëëëëëëëëë"}), _settings(25))  # 8 + 9 x 2 bytes


def test_the_default_limit_is_64_kib(set_env: SetEnv) -> None:
    set_env(max_payload_bytes=None)
    assert Settings().max_payload_bytes == 65_536
    check_common(_n(payload={"b": "x" * (65_536 - 8)}), Settings())
    with pytest.raises(InvalidNotification, match="65537 bytes"):
        check_common(_n(payload={"b": "x" * (65_536 - 7)}), Settings())


def test_the_limit_is_read_from_the_environment(set_env: SetEnv) -> None:
    set_env(max_payload_bytes=1024)
    assert Settings().max_payload_bytes == 1024
    set_env(max_payload_bytes=0)
    with pytest.raises(ValidationError, match="max_payload_bytes"):
        Settings()


def test_recipient_length_is_bounded_for_every_channel() -> None:
    check_common(_n(recipient="r" * MAX_RECIPIENT_LENGTH), _settings(100))
    with pytest.raises(InvalidNotification) as refused:
        check_common(_n(recipient="r" * (MAX_RECIPIENT_LENGTH + 1)), _settings(100))
    assert str(refused.value) == "recipient is longer than 2048 characters"


def test_a_payload_built_in_code_that_is_not_json_is_refused() -> None:
    with pytest.raises(InvalidNotification, match="payload is not JSON-serializable"):
        check_common(_n(payload={"when": datetime(2026, 1, 1)}), _settings(100))
