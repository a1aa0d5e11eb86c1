"""What every provider is: a channel, a check of the row, and a send that says what happens next.

A provider never touches the database or Redis. It answers each send with one of:

* ``Sent(provider_message_id)`` - the provider accepted the message;
* ``Retry(error, retry_after)`` - transient (network, timeout, SMTP 4xx, HTTP 5xx/408/429);
* ``Permanent(error)`` - it will never work (rejected mailbox, 4xx HTTP, invalid recipient).

``validate`` runs before any network call; it raises ``InvalidNotification`` with a message that
tells the producer what to fix, and the row goes to ``dead`` after that one attempt.

A provider that can also send without a thread offers ``send_async`` (``AsyncProvider``): the
dispatcher then runs many of its sends at once on the worker process's event loop, where each
costs far less than a thread of its own.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

from notifier.models import Notification


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


@runtime_checkable
class Provider(Protocol):
    """A way to deliver one channel's notifications.

    ``send`` may be called from several threads at once; ``close`` is called after every batch
    and releases what the sends of that batch kept open (e.g. SMTP connections). A provider may
    also have ``shutdown()``, called when its worker process stops (``Dispatcher.close``), to
    close what it keeps across batches, such as a pool of keep-alive connections.
    """

    channel: ClassVar[str]

    def validate(self, notification: Notification) -> None: ...

    def send(self, notification: Notification) -> Outcome: ...

    def close(self) -> None: ...


@runtime_checkable
class AsyncProvider(Provider, Protocol):
    """A provider whose sends can also run as coroutines on the worker's event loop.

    The dispatcher awaits ``send_async`` (on ``notifier.eventloop``'s loop) for a row that names
    no guard and whose channel's providers, failover ones included, all offer it; other rows go
    through ``send`` in a thread. ``send_async`` answers exactly like ``send``, and:

    * never blocks the loop: no blocking I/O (resolve names in an executor), no long computation;
    * bounds itself with a total timeout of at most ``Settings.longest_send_seconds``, so that it
      ends by itself like ``send`` does through its connect and read timeouts;
    * may be cancelled at any ``await`` (``asyncio.CancelledError``): the dispatcher cancels the
      sends still running ``longest_send_seconds`` after its deadline, and retries their rows.
    """

    async def send_async(self, notification: Notification) -> Outcome: ...


def can_send_async(provider: Provider) -> bool:
    """Whether ``provider`` offers a real coroutine ``send_async`` (see ``AsyncProvider``)."""
    return isinstance(provider, AsyncProvider) and inspect.iscoroutinefunction(provider.send_async)


def truncate(text: str, limit: int = 500) -> str:
    """Keep error texts stored in ``last_error`` readable, bounded and storable: one line,
    at most ``limit`` characters, and every character PostgreSQL cannot store or a terminal
    would act on (NUL, other controls, lone surrogates, bidi overrides) shown as U+FFFD."""
    text = " ".join(text.split())
    if not text.isprintable():
        text = "".join(c if c.isprintable() else "\ufffd" for c in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"
