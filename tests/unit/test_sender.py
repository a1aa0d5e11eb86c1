"""Where a row's send runs: on the event loop, in a thread, or at once. Pure: nothing is sent."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import ClassVar
from uuid import uuid4

import pytest

from notifier.delivery.sender import Sender
from notifier.models import Notification
from notifier.providers import Outcome, Sent, can_send_async
from notifier.providers.null import NullProvider
from notifier.providers.webhook import WebhookProvider
from notifier.settings import Settings


class NotACoroutine(NullProvider):
    """Has a ``send_async``, but a plain function: it would block the loop."""

    channel: ClassVar[str] = "odd"
    inline: ClassVar[bool] = False

    def send_async(self, notification: Notification) -> Outcome:
        return Sent()


def _row(channel: str, guard: str | None = None) -> Notification:
    return Notification(
        id=1,
        channel=channel,
        recipient="x",
        subject=None,
        body=None,
        payload={},
        attempts=1,
        max_attempts=5,
        claim_token=uuid4(),
        created_at=datetime.now(UTC),
        guard=guard,
    )


def test_only_coroutine_send_async_counts() -> None:
    settings = Settings()
    assert can_send_async(WebhookProvider(settings))
    assert not can_send_async(NullProvider(Settings()))
    assert not can_send_async(NotACoroutine(Settings()))


@pytest.mark.parametrize(
    ("channel", "guard", "on_loop", "inline"),
    [
        ("webhook", None, True, False),
        ("webhook", "http", False, False),  # guards are blocking calls: a thread
        ("mixed", None, False, False),  # a failover chain with a provider that cannot
        ("null", None, False, True),
        ("null", "http", False, False),
        ("odd", None, False, False),
    ],
)
def test_where_a_send_runs(channel: str, guard: str | None, on_loop: bool, inline: bool) -> None:
    settings = Settings()
    webhook, null = WebhookProvider(settings), NullProvider(Settings())
    chains = {"webhook": [webhook], "null": [null], "mixed": [webhook, null]}
    sender = Sender({**chains, "odd": [NotACoroutine(Settings())]}, settings)
    row = _row(channel, guard)
    assert (sender.on_loop(row), sender.inline(row)) == (on_loop, inline)
