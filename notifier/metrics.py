"""Prometheus metrics that add up across every worker process on every machine.

Workers count each batch's attempts into Redis (one pipelined round trip per batch); the
``notifier metrics`` process serves them, together with gauges read from PostgreSQL at each
scrape. Counters live in Redis, so they restart from zero if Redis loses its data; Prometheus
treats that as an ordinary counter reset.

Key layout: ``notifier:metrics:attempts`` - a hash of ``channel|provider|outcome`` -> count;
``notifier:metrics:latency`` - a hash of ``channel|provider|le`` -> count per histogram bucket,
plus ``channel|provider|sum`` and ``channel|provider|count``.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from typing import cast

import redis
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import Engine

from notifier import store

log = logging.getLogger(__name__)

ATTEMPTS_KEY = "notifier:metrics:attempts"
LATENCY_KEY = "notifier:metrics:latency"
#: Upper bounds (seconds) of the send-latency histogram's buckets.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def record(client: redis.Redis, attempts: Sequence[store.Attempt]) -> None:
    """Count one batch's attempts, by channel, provider and outcome."""
    if not attempts:
        return
    counts = Counter(f"{a.channel}|{a.provider or a.channel}|{a.outcome}" for a in attempts)
    latency: Counter[str] = Counter()
    sums: dict[str, float] = defaultdict(float)
    for a in attempts:
        if a.duration_ms is None:
            continue
        label = f"{a.channel}|{a.provider or a.channel}"
        seconds = a.duration_ms / 1000
        index = bisect.bisect_left(BUCKETS, seconds)
        latency[f"{label}|{BUCKETS[index] if index < len(BUCKETS) else '+Inf'}"] += 1
        latency[f"{label}|count"] += 1
        sums[f"{label}|sum"] += seconds
    pipe = client.pipeline(transaction=False)
    for field, n in counts.items():
        pipe.hincrby(ATTEMPTS_KEY, field, n)
    for field, n in latency.items():
        pipe.hincrby(LATENCY_KEY, field, n)
    for field, total in sums.items():
        pipe.hincrbyfloat(LATENCY_KEY, field, total)
    pipe.execute()


class NotifierCollector(Collector):
    """Reads the counters from Redis and the queue's gauges from PostgreSQL at each scrape."""

    def __init__(self, engine: Engine, client: redis.Redis) -> None:
        self.engine = engine
        self.client = client

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily]:
        yield from self._counters()
        yield from self._gauges()

    def _counters(self) -> Iterable[CounterMetricFamily | HistogramMetricFamily]:
        try:
            attempts = _decode(self.client.hgetall(ATTEMPTS_KEY))
            latency = _decode(self.client.hgetall(LATENCY_KEY))
        except redis.RedisError as exc:
            log.warning("metrics: Redis unreachable (%s); counters left out", exc)
            return
        family = CounterMetricFamily(
            "notifier_attempts",
            "Attempts by channel, provider and outcome (sent, retry, deferred, dead, cancelled).",
            labels=["channel", "provider", "outcome"],
        )
        for field, value in sorted(attempts.items()):
            family.add_metric(field.split("|", 2), float(value))
        yield family
        histogram = HistogramMetricFamily(
            "notifier_send_duration_seconds",
            "Time a provider took to answer one send.",
            labels=["channel", "provider"],
        )
        for label in sorted({f.rsplit("|", 1)[0] for f in latency}):
            running, buckets = 0.0, []
            for bound in (*BUCKETS, "+Inf"):
                running += float(latency.get(f"{label}|{bound}", 0))
                buckets.append((str(bound), running))
            histogram.add_metric(
                label.split("|", 1), buckets, sum_value=float(latency.get(f"{label}|sum", 0))
            )
        yield histogram

    def _gauges(self) -> Iterable[GaugeMetricFamily]:
        try:
            with self.engine.connect() as conn:
                g = store.gauges(conn)
        except Exception as exc:
            log.warning("metrics: database unreachable (%s); gauges left out", exc)
            return
        for name, text, value in (
            ("notifier_due", "Pending rows due now.", g.due),
            ("notifier_lag_seconds", "How long the oldest due row has waited.", g.lag_seconds),
            ("notifier_processing", "Rows claimed by a worker right now.", g.processing),
            ("notifier_dead_last_hour", "Rows that went dead in the last hour.", g.dead_last_hour),
        ):
            yield GaugeMetricFamily(name, text, value=value)


def _decode(raw: object) -> dict[str, str]:
    items = cast("dict[bytes, bytes]", raw)
    return {k.decode(): v.decode() for k, v in items.items()}


def serve(engine: Engine, client: redis.Redis, port: int, host: str = "0.0.0.0") -> None:  # noqa: S104
    """Serve ``/metrics`` on ``port`` until the process is stopped."""
    registry = CollectorRegistry()
    registry.register(NotifierCollector(engine, client))
    start_http_server(port, addr=host, registry=registry)
    log.info("serving metrics on %s:%d", host, port)
    while True:
        time.sleep(3600)
