"""Scraping ``notifier metrics``' real endpoint, started on a free loopback port."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import redis
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine

from notifier import metrics

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def samples(body: str) -> Samples:
    """Every sample of an exposition, by name and sorted labels."""
    found = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def serve(engine: Engine, client: redis.Redis, labels: metrics.Labels) -> str:
    """Serve the metrics in a thread (for the rest of the run) and return ``host:port`` once
    ``/metrics`` answers."""
    port = _free_port()
    threading.Thread(
        target=metrics.serve, args=(engine, client, labels, port, "127.0.0.1"), daemon=True
    ).start()
    deadline = time.monotonic() + 10
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
            return f"127.0.0.1:{port}"
        except httpx.TransportError:
            assert time.monotonic() < deadline, "the metrics endpoint never came up"
            time.sleep(0.1)


def scrape(engine: Engine, client: redis.Redis, labels: metrics.Labels) -> str:
    """Serve the metrics in a thread and GET ``/metrics`` once."""
    return httpx.get(f"http://{serve(engine, client, labels)}/metrics", timeout=10).text
