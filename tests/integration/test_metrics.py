"""Metrics after a known set of outcomes, scraped from the real endpoint."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, text

from notifier import metrics
from notifier.dispatch import Dispatcher
from notifier.providers import load_registry
from notifier.settings import Settings


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _samples(body: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


@pytest.mark.timeout(60)
def test_counts_gauges_and_latency_after_known_outcomes(
    engine: Engine, settings: Settings, redis_url: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO notifications (channel, recipient, next_attempt_at) VALUES"
                " ('null', 'a', now()), ('null', 'b', now()), ('pigeon', 'c', now()),"
                " ('null', 'later', now() + interval '1 hour'),"
                " ('null', 'waiting', now() - interval '90 seconds')"
            )
        )
    dispatcher = Dispatcher(
        engine,
        load_registry(),
        settings.model_copy(update={"batch_size": 4}),
        observe=lambda attempts: metrics.record(client, attempts),
    )
    assert dispatcher.run_once().claimed == 4  # every due row: three sent, the pigeon dead
    dispatcher.close()
    with engine.begin() as conn:  # the delayed row, claimed by a worker right now
        conn.execute(
            text(
                "UPDATE notifications SET status = 'processing', claim_token = gen_random_uuid(),"
                " locked_until = now() + interval '1 minute' WHERE recipient = 'later'"
            )
        )

    port = _free_port()
    threading.Thread(
        target=metrics.serve, args=(engine, client, port, "127.0.0.1"), daemon=True
    ).start()
    deadline = time.monotonic() + 10
    while True:
        try:
            body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline, "the metrics endpoint never came up"
            time.sleep(0.1)
    client.close()

    found = _samples(body)

    def attempts(channel: str, outcome: str) -> float:
        labels = (("channel", channel), ("outcome", outcome), ("provider", channel))
        return found[("notifier_attempts_total", labels)]

    assert attempts("null", "sent") == 3
    assert attempts("pigeon", "dead") == 1
    assert found[("notifier_processing", ())] == 1
    assert found[("notifier_due", ())] == 0
    assert found[("notifier_dead_last_hour", ())] == 1
    latency = ("notifier_send_duration_seconds_count", (("channel", "null"), ("provider", "null")))
    assert found[latency] == 3
    inf = (
        "notifier_send_duration_seconds_bucket",
        (("channel", "null"), ("le", "+Inf"), ("provider", "null")),
    )
    assert found[inf] == 3
