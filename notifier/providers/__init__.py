"""The providers, found by channel.

Built-ins and a deployment's own providers register through the ``notifier.providers``
entry-point group (``channel = "package.module:ProviderClass"``); the class is instantiated once
per process with no arguments and reads its configuration from ``notifier.settings``. Two
providers claiming the same channel is a configuration error, raised at start-up.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from importlib.metadata import entry_points

from notifier.providers.base import (
    InvalidNotification,
    Outcome,
    Permanent,
    Provider,
    Retry,
    Sent,
)

ENTRY_POINT_GROUP = "notifier.providers"

__all__ = [
    "ENTRY_POINT_GROUP",
    "InvalidNotification",
    "Outcome",
    "Permanent",
    "Provider",
    "Registry",
    "Retry",
    "Sent",
    "load_registry",
]


class Registry(Mapping[str, Provider]):
    """Providers by channel; refuses two providers for one channel."""

    def __init__(self, providers: Iterable[Provider] = ()) -> None:
        self._by_channel: dict[str, Provider] = {}
        for provider in providers:
            self.register(provider)

    def register(self, provider: Provider) -> None:
        channel = provider.channel
        if channel in self._by_channel:
            existing = type(self._by_channel[channel]).__qualname__
            raise ValueError(
                f"channel {channel!r} has two providers: {existing} and "
                f"{type(provider).__qualname__}"
            )
        self._by_channel[channel] = provider

    def __getitem__(self, channel: str) -> Provider:
        return self._by_channel[channel]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._by_channel)

    def __len__(self) -> int:
        return len(self._by_channel)

    def close(self) -> None:
        for provider in self._by_channel.values():
            provider.close()


def load_registry() -> Registry:
    """Instantiate every provider registered under the ``notifier.providers`` entry points."""
    registry = Registry()
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        cls = ep.load()
        provider = cls()
        if provider.channel != ep.name:
            raise ValueError(
                f"entry point {ep.name!r} loads {cls.__qualname__}, whose channel is "
                f"{provider.channel!r}; the two must match"
            )
        registry.register(provider)
    return registry
