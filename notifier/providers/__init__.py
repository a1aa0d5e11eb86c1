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
    can_send_async,
)
from notifier.settings import Settings

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
    "can_send_async",
    "chains",
    "load_registry",
    "provider_name",
    "registry_of",
]

Registry = plugins.Registry[Provider]


def provider_name(provider: Provider) -> str:
    """A provider's own name: its ``name``, or its channel's when it has none."""
    return provider.name or provider.channel


def registry_of(providers: Iterable[Provider]) -> Registry:
    """A registry holding exactly these providers, by name."""
    return plugins.Registry(provider_name, providers)


def load_registry(settings: Settings) -> Registry:
    """Instantiate every provider registered under the ``notifier.providers`` entry points."""
    return plugins.load(ENTRY_POINT_GROUP, provider_name, settings)


def chains(registry: Registry, failover: dict[str, list[str]]) -> dict[str, list[Provider]]:
    """The providers of each channel in the order they are tried.

    A channel without a failover entry is served by the provider named like it. Refuses a
    failover entry naming a provider that is not installed or serves another channel.
    """
    result: dict[str, list[Provider]] = {}
    for name, provider in registry.items():
        if name == provider.channel:
            result[provider.channel] = [provider]
    for channel, names in failover.items():
        missing = [n for n in names if n not in registry]
        if missing:
            raise ValueError(
                f"NOTIFIER_FAILOVER names providers that are not installed: {', '.join(missing)}"
                f" (installed: {', '.join(sorted(registry))})"
            )
        wrong = [n for n in names if registry[n].channel != channel]
        if wrong:
            raise ValueError(f"NOTIFIER_FAILOVER: {', '.join(wrong)} do not serve {channel!r}")
        result[channel] = [registry[n] for n in names]
    return result
