"""Prometheus metrics that add up across every worker process on every machine.

Workers count each batch's attempts into Redis (one pipelined round trip per batch); the
``notifier metrics`` process serves them, together with gauges read from PostgreSQL at each
scrape. Counters live in Redis, so they restart from zero if Redis loses its data; Prometheus
treats that as an ordinary counter reset. Whichever of the two cannot be read leaves its series
out of that scrape, and ``notifier_dependency_up`` says which (the alerting rules in
``deploy/prometheus/alerts.yml`` read it).

Key layout: ``notifier:metrics:attempts`` - a hash of ``channel|provider|outcome`` -> count;
``notifier:metrics:latency`` - a hash of ``channel|provider|le`` -> count per histogram bucket,
plus ``channel|provider|sum`` and ``channel|provider|count``; ``notifier:metrics:events`` - a hash
of ``provider|outcome`` -> count, written by the events endpoint (``notifier.events.app``).

Label values are bounded: producers may write any string as a row's channel, so a channel or
provider this deployment does not serve, or an outcome not in ``OUTCOMES``, is counted as
``other``, and the series stay as few as the installed providers. Each part of a field is
percent-encoded, so no value can contain the ``|`` that separates them; reading decodes them
and folds anything unknown (written by an older version, say) into ``other`` again.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import cast
from urllib.parse import quote, unquote

import redis
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import Engine

from notifier.db import stats, status_events
from notifier.models import Decision
from notifier.providers import Registry

log = logging.getLogger(__name__)

ATTEMPTS_KEY = "notifier:metrics:attempts"
LATENCY_KEY = "notifier:metrics:latency"
EVENTS_KEY = "notifier:metrics:events"
#: The events endpoint's routes that count requests, and what became of them.
EVENT_PROVIDERS = frozenset({"ses", "sendgrid", "mailgun", "postmark", "twilio", "unsubscribe"})
EVENT_OUTCOMES = frozenset({"refused", "applied", "unmatched", "unchanged", "mismatched"})
#: Upper bounds (seconds) of the send-latency histogram's buckets.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: Each bucket's field name, by the index ``bisect_left(BUCKETS, seconds)`` gives.
BUCKET_NAMES = (*(str(b) for b in BUCKETS), "+Inf")
#: The outcomes an attempt can have (the attempt history's CHECK constraint).
OUTCOMES = frozenset({"sent", "retry", "deferred", "dead", "cancelled", "rescued"})
#: The label value of every channel, provider or outcome outside the known ones.
OTHER = "other"


@dataclass(frozen=True, slots=True)
class Labels:
    """The label values this deployment may report; anything else becomes ``OTHER``."""

    channels: frozenset[str]
    providers: frozenset[str]

    @classmethod
    def of(cls, registry: Registry) -> Labels:
        """The channels and providers of the installed providers."""
        return cls(frozenset(p.channel for p in registry.values()), frozenset(registry))

    def bound(self, channel: str, provider: str | None) -> tuple[str, str]:
        """``(channel, provider)`` as labels; no provider means the one named like the channel."""
        provider = provider or channel
        return (
            channel if channel in self.channels else OTHER,
            provider if provider in self.providers else OTHER,
        )

    def key(self, channel: str, provider: str | None, last: str) -> str:
        """The hash field of one series: known values only, each part encoded."""
        return "|".join(quote(part, safe="") for part in (*self.bound(channel, provider), last))


def record(client: redis.Redis, attempts: Sequence[Decision], labels: Labels) -> None:
    """Count one batch's attempts, by channel, provider and outcome.

    Grouped first by their raw values, so a field is built once per series, not once per
    attempt: a group of a thousand plain sends costs a handful of keys."""
    if not attempts:
        return
    outcomes: Counter[tuple[str, str | None, str]] = Counter()
    buckets: Counter[tuple[str, str | None, str]] = Counter()
    sums: dict[tuple[str, str | None], float] = defaultdict(float)
    for a in attempts:
        outcomes[a.channel, a.provider, a.outcome] += 1
        if a.duration_ms is not None:
            seconds = a.duration_ms / 1000
            buckets[a.channel, a.provider, BUCKET_NAMES[bisect.bisect_left(BUCKETS, seconds)]] += 1
            sums[a.channel, a.provider] += seconds
    counts: Counter[str] = Counter()
    for (channel, provider, outcome), n in outcomes.items():
        counts[labels.key(channel, provider, outcome if outcome in OUTCOMES else OTHER)] += n
    latency: Counter[str] = Counter()
    for (channel, provider, bucket), n in buckets.items():
        latency[labels.key(channel, provider, bucket)] += n
        latency[labels.key(channel, provider, "count")] += n
    totals: dict[str, float] = defaultdict(float)
    for (channel, provider), total in sums.items():
        totals[labels.key(channel, provider, "sum")] += total
    pipe = client.pipeline(transaction=False)
    for field, n in counts.items():
        pipe.hincrby(ATTEMPTS_KEY, field, n)
    for field, n in latency.items():
        pipe.hincrby(LATENCY_KEY, field, n)
    for field, total in totals.items():
        pipe.hincrbyfloat(LATENCY_KEY, field, total)
    pipe.execute()


class NotifierCollector(Collector):
    """Reads the counters from Redis and the queue's gauges from PostgreSQL at each scrape."""

    def __init__(self, engine: Engine, client: redis.Redis, labels: Labels) -> None:
        self.engine = engine
        self.client = client
        self.labels = labels

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily]:
        redis_up = yield from self._counters()
        postgres_up = yield from self._gauges()
        # Said outright, not left to the absence of the series above: an alert on a missing
        # series cannot tell "Redis is down" from "nothing scraped".
        up = GaugeMetricFamily(
            "notifier_dependency_up",
            "1 if this scrape could read the dependency (postgres, redis), 0 if not.",
            labels=["dependency"],
        )
        up.add_metric(["postgres"], float(postgres_up))
        up.add_metric(["redis"], float(redis_up))
        yield up

    def _counters(self) -> Generator[CounterMetricFamily | HistogramMetricFamily, None, bool]:
        """The counters from Redis; returns whether Redis could be read."""
        try:
            raw_attempts = _decode(self.client.hgetall(ATTEMPTS_KEY))
            raw_latency = _decode(self.client.hgetall(LATENCY_KEY))
            raw_events = _decode(self.client.hgetall(EVENTS_KEY))
        except redis.RedisError as exc:
            log.warning("metrics: Redis unreachable (%s); counters left out", exc)
            return False
        attempts: dict[tuple[str, str, str], float] = defaultdict(float)
        for (channel, provider, outcome), value in self._series(raw_attempts):
            attempts[channel, provider, outcome if outcome in OUTCOMES else OTHER] += value
        family = CounterMetricFamily(
            "notifier_attempts",
            "Attempts by channel, provider and outcome (sent, retry, deferred, dead, cancelled).",
            labels=["channel", "provider", "outcome"],
        )
        for series, value in sorted(attempts.items()):
            family.add_metric(list(series), value)
        yield family
        latency: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for (channel, provider, part), value in self._series(raw_latency):
            latency[channel, provider][part] += value
        histogram = HistogramMetricFamily(
            "notifier_send_duration_seconds",
            "Time a provider took to answer one send.",
            labels=["channel", "provider"],
        )
        for pair, parts in sorted(latency.items()):
            running, buckets = 0.0, []
            for name in BUCKET_NAMES:
                running += parts.get(name, 0.0)
                buckets.append((name, running))
            histogram.add_metric(list(pair), buckets, sum_value=parts.get("sum", 0.0))
        yield histogram
        yield _events(raw_events)
        return True

    def _series(self, fields: dict[str, str]) -> Iterator[tuple[tuple[str, str, str], float]]:
        """Each well-formed ``channel|provider|last`` field, decoded and bounded, and its value."""
        for field, value in fields.items():
            parts = [unquote(p) for p in field.split("|")]
            if len(parts) != 3:  # not written by ``record``: skipped rather than mislabelled
                continue
            try:
                number = float(value)
            except ValueError:
                continue
            channel, provider = self.labels.bound(parts[0], parts[1])
            yield (channel, provider, parts[2]), number

    def _gauges(self) -> Generator[GaugeMetricFamily, None, bool]:
        """The queue's gauges from PostgreSQL; returns whether PostgreSQL could be read."""
        try:
            with self.engine.connect() as conn:
                g = stats.gauges(conn)
                rescued = stats.rescued_last_hour(conn)
        except Exception as exc:
            log.warning("metrics: database unreachable (%s); gauges left out", exc)
            return False
        for name, text, value in (
            ("notifier_due", "Pending rows due now.", g.due),
            (
                "notifier_lag_seconds",
                "How long the oldest due row has waited.",
                g.lag_seconds or 0.0,
            ),
            ("notifier_processing", "Rows claimed by a worker right now.", g.processing),
            ("notifier_dead_last_hour", "Rows that went dead in the last hour.", g.dead_last_hour),
            (
                "notifier_rescued_last_hour",
                "Rows taken back in the last hour from a worker that stopped mid-send.",
                rescued,
            ),
        ):
            yield GaugeMetricFamily(name, text, value=value)
        yield from _status_events(self.engine)
        return True


def _events(fields: dict[str, str]) -> CounterMetricFamily:
    """The events endpoint's requests by provider and outcome, unknown values as ``other``."""
    counts: dict[tuple[str, str], float] = defaultdict(float)
    for field, value in fields.items():
        parts = field.split("|")
        if len(parts) != 2:
            continue
        try:
            number = float(value)
        except ValueError:
            continue
        provider, outcome = parts
        counts[
            provider if provider in EVENT_PROVIDERS else OTHER,
            outcome if outcome in EVENT_OUTCOMES else OTHER,
        ] += number
    family = CounterMetricFamily(
        "notifier_events",
        "Requests to the events endpoint by provider and outcome (refused, applied, unmatched,"
        " unchanged).",
        labels=["provider", "outcome"],
    )
    for series, number in sorted(counts.items()):
        family.add_metric(list(series), number)
    return family


def _status_events(engine: Engine) -> Iterator[GaugeMetricFamily]:
    """The status webhook's outbox: events waiting, being sent, given up."""
    try:
        with engine.connect() as conn:
            c = status_events.counts(conn)
    except Exception as exc:
        log.warning("metrics: database unreachable (%s); status events left out", exc)
        return
    family = GaugeMetricFamily(
        "notifier_status_events",
        "Status webhook events by state: pending, processing, dead (sent ones are not counted).",
        labels=["status"],
    )
    for status, value in (("pending", c.pending), ("processing", c.processing), ("dead", c.dead)):
        family.add_metric([status], value)
    yield family
    yield GaugeMetricFamily(
        "notifier_status_events_oldest_seconds",
        "How long the oldest pending status webhook event has waited.",
        value=c.oldest_pending_seconds,
    )


def _decode(raw: object) -> dict[str, str]:
    items = cast("dict[bytes, bytes]", raw)
    return {k.decode(): v.decode() for k, v in items.items()}


def serve(
    engine: Engine,
    client: redis.Redis,
    labels: Labels,
    port: int,
    host: str = "0.0.0.0",  # noqa: S104
) -> None:
    """Serve ``/metrics`` on ``port`` until the process is stopped."""
    registry = CollectorRegistry()
    registry.register(NotifierCollector(engine, client, labels))
    start_http_server(port, addr=host, registry=registry)
    log.info("serving metrics on %s:%d", host, port)
    while True:
        time.sleep(3600)
