"""The provider registry."""

from __future__ import annotations

import pytest

from notifier.providers import registry_of
from notifier.providers.null import NullProvider
from notifier.settings import Settings


def test_refuses_two_providers_for_one_channel() -> None:
    registry = registry_of([NullProvider(Settings())])
    with pytest.raises(ValueError, match="'null' has two plugins"):
        registry.register(NullProvider(Settings()))


def test_finds_by_channel() -> None:
    registry = registry_of([NullProvider(Settings())])
    assert isinstance(registry["null"], NullProvider)
    assert registry.get("sms") is None
    assert list(registry) == ["null"]
