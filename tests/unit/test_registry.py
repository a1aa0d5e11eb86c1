"""The provider registry."""

from __future__ import annotations

import pytest

from notifier.providers import Registry
from notifier.providers.null import NullProvider


def test_refuses_two_providers_for_one_channel() -> None:
    registry = Registry([NullProvider()])
    with pytest.raises(ValueError, match="'null' has two providers"):
        registry.register(NullProvider())


def test_finds_by_channel() -> None:
    registry = Registry([NullProvider()])
    assert isinstance(registry["null"], NullProvider)
    assert registry.get("sms") is None
    assert list(registry) == ["null"]
