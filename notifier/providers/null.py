"""The ``null`` channel: accepts everything and delivers nothing (dry runs, load tests)."""

from __future__ import annotations

from typing import ClassVar

from notifier.models import Notification
from notifier.providers.base import Outcome, Provider, Sent


class NullProvider(Provider):
    channel: ClassVar[str] = "null"
    inline: ClassVar[bool] = True

    def send(self, notification: Notification) -> Outcome:
        return Sent(f"null-{notification.id}")
