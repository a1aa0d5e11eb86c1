"""Where a row's send runs: on the event loop, in a thread, or at once. Pure: nothing is sent."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
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


class Batching(NullProvider):
    """Sends on the loop, several rows a request, answering as ``mode`` says: ``ok``, ``raise``
    (a bug in its batch send) or ``short`` (one answer fewer than rows)."""

    channel: ClassVar[str] = "batched"
    inline: ClassVar[bool] = False
    max_batch: ClassVar[int] = 3

    def __init__(self, settings: Settings, mode: str = "ok") -> None:
        super().__init__(settings)
        self.mode = mode
        self.requests: list[list[int]] = []

    def batch_key(self, notification: Notification) -> str | None:
        return None if notification.recipient == "alone" else "same"

    async def send_async(self, notification: Notification) -> Outcome:
        self.requests.append([notification.id])
        return Sent(f"one-{notification.id}")

    async def send_batch_async(self, rows: Sequence[Notification]) -> list[Outcome]:
        self.requests.append([n.id for n in rows])
        if self.mode == "raise":
            raise RuntimeError("a bug")
        answers: list[Outcome] = [Sent(f"many-{n.id}") for n in rows]
        return answers[:-1] if self.mode == "short" else answers


def _sent(sender: Sender, rows: list[Notification]) -> dict[int, object]:
    assert sender.start(rows, lambda n: None) == []
    got: dict[int, object] = {}
    while sender.running:
        got.update({i: a.result for i, a in sender.wait(5).items()})
    return got


def _rows(*recipients: str) -> list[Notification]:
    return [replace(_row("batched"), id=i, recipient=r) for i, r in enumerate(recipients, start=1)]


def test_rows_that_may_share_a_request_go_in_requests_of_max_batch() -> None:
    provider = Batching(Settings())
    sender = Sender({"batched": [provider]}, Settings())
    got = _sent(sender, _rows("a", "b", "alone", "c", "d"))
    assert sorted(provider.requests) == [[1, 2, 4], [3], [5]]
    assert got == {1: Sent("many-1"), 2: Sent("many-2"), 3: Sent("one-3"), 4: Sent("many-4"),
                   5: Sent("one-5")}  # fmt: skip


@pytest.mark.parametrize("mode", ["raise", "short"])
def test_a_batch_send_that_breaks_sends_each_row_on_its_own(mode: str) -> None:
    provider = Batching(Settings(), mode)
    sender = Sender({"batched": [provider]}, Settings())
    got = _sent(sender, _rows("a", "b"))
    assert provider.requests == [[1, 2], [1], [2]]
    assert got == {1: Sent("one-1"), 2: Sent("one-2")}
