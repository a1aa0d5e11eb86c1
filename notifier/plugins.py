"""Named plugins found through entry points: providers by channel, guards by name.

A deployment adds its own in its package's metadata, e.g. in ``pyproject.toml``::

    [project.entry-points."notifier.providers"]
    sms = "mypkg.sms:SmsProvider"

Each class is instantiated once per process with the process's ``Settings``, its one source of
configuration. Two plugins under one name is a configuration error, raised at start.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from importlib.metadata import entry_points
from typing import Generic, Protocol, TypeVar

from notifier.settings import Settings


class Closeable(Protocol):
    def close(self) -> None: ...


T = TypeVar("T", bound=Closeable)


class Registry(Mapping[str, T], Generic[T]):
    """Plugins by name; refuses two plugins for one name."""

    def __init__(self, name_of: Callable[[T], str], plugins: Iterable[T] = ()) -> None:
        self._name_of = name_of
        self._by_name: dict[str, T] = {}
        for plugin in plugins:
            self.register(plugin)

    def register(self, plugin: T) -> None:
        name = self._name_of(plugin)
        if name in self._by_name:
            existing = type(self._by_name[name]).__qualname__
            raise ValueError(
                f"{name!r} has two plugins: {existing} and {type(plugin).__qualname__}"
            )
        self._by_name[name] = plugin

    def __getitem__(self, name: str) -> T:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def close(self) -> None:
        for plugin in self._by_name.values():
            plugin.close()


def load(group: str, name_of: Callable[[T], str], settings: Settings) -> Registry[T]:
    """Instantiate every class registered under the entry-point ``group`` with ``settings``."""
    registry: Registry[T] = Registry(name_of)
    for ep in entry_points(group=group):
        cls = ep.load()
        plugin = cls(settings)
        if name_of(plugin) != ep.name:
            raise ValueError(
                f"entry point {ep.name!r} in {group} loads {cls.__qualname__}, which calls "
                f"itself {name_of(plugin)!r}; the two must match"
            )
        registry.register(plugin)
    return registry
