"""What every provider is: a channel, a check of the row, and a send that says what happens next.

A provider never touches the database or Redis. It answers each send with one of:

* ``Sent(provider_message_id)`` - the provider accepted the message;
* ``Retry(error, retry_after)`` - transient (network, timeout, SMTP 4xx, HTTP 5xx/408/429);
* ``Permanent(error)`` - it will never work (rejected mailbox, 4xx HTTP, invalid recipient).

``validate`` runs before any network call; it raises ``InvalidNotification`` with a message that
tells the producer what to fix, and the row goes to ``dead`` after that one attempt.

A provider that can also send without a thread overrides ``send_async``: the dispatcher then
runs many of its sends at once on the worker process's event loop, where each costs far less
than a thread of its own.

A provider whose API takes many messages in one request also answers ``send_batch_async`` for
rows that may share one (``batch_key``): up to ``max_batch`` rows a request, one outcome each.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from notifier.models import Notification
from notifier.settings import Settings


@dataclass(frozen=True, slots=True)
class Sent:
    provider_message_id: str | None = None


@dataclass(frozen=True, slots=True)
class Retry:
    error: str
    retry_after: float | None = None
    #: the provider asked us to slow down (HTTP 429): no attempt is used up, and every worker
    #: holds back from this provider for ``retry_after`` seconds
    throttled: bool = False
    #: who asked to slow down, when it is not the channel's provider as a whole: one receiver
    #: (``webhook:host:port``), held back alone so that it cannot hold back the others
    scope: str | None = None


@dataclass(frozen=True, slots=True)
class Permanent:
    error: str
    #: the recipient itself is refused for good (an SMTP mailbox that does not exist), so the
    #: dispatcher adds it to the suppression list and nothing is sent to it again
    suppress: bool = False


Outcome = Sent | Retry | Permanent


class InvalidNotification(ValueError):
    """The row can never be sent as written; the message says what the producer must fix."""


class Provider:
    """A way to deliver one channel's notifications. Subclass it and override ``send``; every
    other method has a default that does nothing, for a provider that needs nothing more.

    ``send`` may be called from several threads at once. ``close`` is called after every batch
    and releases what the sends of that batch kept open (e.g. SMTP connections); ``shutdown``
    when its worker process stops (``Dispatcher.close``), to close what it keeps across batches,
    such as a pool of keep-alive connections.

    A provider that can also send without a thread overrides ``send_async``, a coroutine: the
    dispatcher awaits it (on ``notifier.eventloop``'s loop) for a row that names no guard and
    whose channel's providers, failover ones included, all override it; other rows go through
    ``send`` in a thread. ``send_async`` answers exactly like ``send``, and:

    * never blocks the loop: no blocking I/O (resolve names in an executor), no long computation;
    * bounds itself with a total timeout of at most ``Settings.longest_send_seconds``, so that it
      ends by itself like ``send`` does through its connect and read timeouts;
    * may be cancelled at any ``await`` (``asyncio.CancelledError``): the dispatcher cancels the
      sends still running ``longest_send_seconds`` after its deadline, and retries their rows.

    Every provider is made with the process's ``Settings`` (``load_registry``) and reads its
    configuration from them, never from the environment.
    """

    channel: ClassVar[str]
    #: the provider's name in the registry, failover chains and metrics; its channel's if empty
    name: str = ""
    #: does no I/O: the dispatcher calls it inline rather than through its thread pool
    inline: ClassVar[bool] = False
    #: rows one request of ``send_batch_async`` may carry; 1: the provider sends one at a time
    max_batch: ClassVar[int] = 1

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def validate(self, notification: Notification) -> None:
        """Raise ``InvalidNotification`` if the row can never be sent as written."""

    def validate_recipient(self, recipient: str) -> None:
        """Raise ``InvalidNotification`` if no row to ``recipient`` can ever be sent: the part
        of ``validate`` that reads the recipient alone (which ``validate`` runs first), so that
        a campaign's audience is checked line by line at import. Nothing by default."""

    def send(self, notification: Notification) -> Outcome:
        raise NotImplementedError

    async def send_async(self, notification: Notification) -> Outcome:
        raise NotImplementedError

    def batch_key(self, notification: Notification) -> Hashable | None:
        """Rows with equal keys that are not ``None`` may share one request of
        ``send_batch_async``; ``None`` (the default): the row goes in a request of its own."""
        return None

    async def send_batch_async(self, rows: Sequence[Notification]) -> list[Outcome]:
        """One outcome per row, in the order of ``rows``, which the caller groups by
        ``batch_key`` and cuts to at most ``max_batch``; the same rules as ``send_async``
        (bounded in time, cancellable). By default each row is sent by ``send_async``."""
        return list(await asyncio.gather(*(self.send_async(n) for n in rows)))

    def problem(self) -> str | None:
        """Why this provider cannot send anything in this deployment (credentials missing),
        naming the settings to fix; ``None`` when it can. Workers report it when they start;
        its rows fail with the same reason."""
        return None

    def throttle_scope(self, notification: Notification) -> str | None:
        """Who would ask to slow down for this row, when not the provider as a whole (one
        webhook receiver): a 429 from it holds back only the rows of that scope."""
        return None

    def close(self) -> None:
        """Release what the sends of the last batch kept open."""

    def shutdown(self) -> None:
        """Release what the provider keeps across batches; its worker process is stopping."""


def can_send_async(provider: Provider) -> bool:
    """Whether ``provider`` overrides ``send_async`` with a real coroutine."""
    method = type(provider).send_async
    return method is not Provider.send_async and inspect.iscoroutinefunction(method)
