"""The ``null`` channel: accepts everything and delivers nothing (dry runs, load tests)."""

from __future__ import annotations

from typing import ClassVar

from notifier.models import Notification
from notifier.providers.base import Outcome, Sent


class NullProvider:
    channel: ClassVar[str] = "null"
    #: does no I/O: the dispatcher calls it inline rather than through its thread pool
    inline: ClassVar[bool] = True

    def validate(self, notification: Notification) -> None:
        return None

    def send(self, notification: Notification) -> Outcome:
        return Sent(f"null-{notification.id}")

    def close(self) -> None:
        return None
