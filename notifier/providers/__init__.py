"""The providers, found by channel through the ``notifier.providers`` entry-point group.

See ``notifier.plugins`` for how a deployment adds its own, and ``base`` for what one is.
"""

from __future__ import annotations

from collections.abc import Iterable

from notifier import plugins
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
    "registry_of",
]

Registry = plugins.Registry[Provider]


def _channel(provider: Provider) -> str:
    return provider.channel


def registry_of(providers: Iterable[Provider]) -> Registry:
    """A registry holding exactly these providers."""
    return plugins.Registry(_channel, providers)


def load_registry() -> Registry:
    """Instantiate every provider registered under the ``notifier.providers`` entry points."""
    return plugins.load(ENTRY_POINT_GROUP, _channel)
