"""Metrics after a known set of outcomes, scraped from the real endpoint."""

from __future__ import annotations

import pytest
import redis
from sqlalchemy import Engine, text

from notifier import metrics
from notifier.delivery.dispatcher import Dispatcher
from notifier.models import AttemptOutcome, Decision
from notifier.providers import load_registry
from notifier.settings import get_settings
from tests.factories import MakeRow, MakeSettings, ago, from_now
from tests.prometheus import samples, scrape


@pytest.mark.timeout(60)
def test_counts_gauges_and_latency_after_known_outcomes(
    engine: Engine, make_settings: MakeSettings, make_row: MakeRow, redis_url: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    for recipient, channel, due in [
        ("a", "null", ago()),
        ("b", "null", ago()),
        ("c", "pigeon", ago()),
        ("later", "null", from_now(hours=1)),
        ("waiting", "null", ago(seconds=90)),
    ]:
        make_row(channel=channel, recipient=recipient, next_attempt_at=due)
    registry = load_registry(get_settings())
    labels = metrics.Labels.of(registry)
    dispatcher = Dispatcher(
        engine,
        registry,
        make_settings(batch_size=4),
        observe=lambda attempts: metrics.record(client, attempts, labels),
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

    body = scrape(engine, client, labels)
    client.close()

    found = samples(body)

    def attempts(channel: str, outcome: str) -> float:
        labels = (("channel", channel), ("outcome", outcome), ("provider", channel))
        return found[("notifier_attempts_total", labels)]

    assert attempts("null", "sent") == 3
    assert attempts("other", "dead") == 1  # a channel nobody serves: no series of its own
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


HOSTILE = ["a|b|c", "null|null|sent", "x\ny", 'q"uote', "back\\slash", "%7C", "", " null"]


@pytest.mark.timeout(60)
def test_hostile_channel_names_count_under_other_and_never_corrupt_labels(
    engine: Engine, redis_url: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    labels = metrics.Labels(frozenset({"null", "email"}), frozenset({"null", "email"}))
    names = HOSTILE + [f"spam-{i}" for i in range(10_000)]
    dead, sent = AttemptOutcome.dead, AttemptOutcome.sent
    attempts = [
        Decision(i, name, dead, "no provider", duration_ms=3) for i, name in enumerate(names)
    ]
    attempts.append(Decision(0, "null", sent, duration_ms=3))
    unknown = Decision(0, "null", sent, duration_ms=3)
    unknown.outcome = "sent|x"  # type: ignore[assignment]  # one this version does not know
    attempts.append(unknown)
    attempts.append(Decision(0, "email", sent, duration_ms=3, provider="a|b"))
    metrics.record(client, attempts, labels)

    assert client.hlen(metrics.ATTEMPTS_KEY) == 4  # bounded in Redis, not only on the page
    body = scrape(engine, client, labels)
    client.close()
    series = {
        key: value for key, value in samples(body).items() if key[0] == "notifier_attempts_total"
    }
    assert series == {
        ("notifier_attempts_total", _labels("other", "other", "dead")): len(names),
        ("notifier_attempts_total", _labels("null", "null", "sent")): 1,
        ("notifier_attempts_total", _labels("null", "null", "other")): 1,
        ("notifier_attempts_total", _labels("email", "other", "sent")): 1,
    }
    durations = {k for k in samples(body) if k[0] == "notifier_send_duration_seconds_count"}
    assert {dict(k[1])["channel"] for k in durations} == {"other", "null", "email"}


@pytest.mark.timeout(60)
def test_fields_written_before_bounding_are_folded_into_other(
    engine: Engine, redis_url: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    client.hset(
        metrics.ATTEMPTS_KEY,
        mapping={"pig|eon|pig|dead": 5, "pigeon|pigeon|dead": 2, "null|null|sent": 1, "x": 9},
    )
    labels = metrics.Labels(frozenset({"null"}), frozenset({"null"}))
    found = samples(scrape(engine, client, labels))
    client.close()
    assert found[("notifier_attempts_total", _labels("other", "other", "dead"))] == 2
    assert found[("notifier_attempts_total", _labels("null", "null", "sent"))] == 1
    assert not [k for k in found if k[0] == "notifier_attempts_total" and len(k[1]) != 3]


def _labels(channel: str, provider: str, outcome: str) -> tuple[tuple[str, str], ...]:
    return (("channel", channel), ("outcome", outcome), ("provider", provider))
