"""Every query of the Grafana dashboard returns data from a real Prometheus, and the alerting
rules load into it without errors.

Prometheus runs the shipped config (``tests.prometheus_server.local_config``) with 1 s scrapes:
of ``notifier metrics`` against the test's database and Redis, of Flower, and of itself. A real
worker and beat deliver the rows (three sent and one dead a wave, made as
``tests/integration/test_metrics.py`` makes them), in two waves with a scrape between them, so
that each rate has a sample before the increase and after it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from sqlalchemy import Engine

from notifier import metrics
from notifier.providers import load_registry
from notifier.settings import get_settings
from tests.acceptance.conftest import REPO, Services, running_flower
from tests.factories import MakeRow
from tests.prometheus import serve
from tests.prometheus_server import RULES, PrometheusServer, local_config, needs_prometheus
from tests.server_process import listening

DASHBOARDS = sorted((REPO / "deploy" / "grafana" / "dashboards").glob("*.json"))
#: Grafana's own variables, as Grafana fills them in for this datasource: ``$__rate_interval``
#: is four scrape intervals of 15 s (deploy/grafana/provisioning/datasources/prometheus.yml).
GRAFANA = {"$__rate_interval": "1m"}
FLOWER_LOGIN = ("user", "pass")

pytestmark = [needs_prometheus, pytest.mark.slow]


def dashboard_queries() -> list[tuple[str, str]]:
    """``(where, expr)`` of every target of every panel of every dashboard."""
    return [
        (f"{path.name}: {panel.get('title')}", target["expr"])
        for path in DASHBOARDS
        for panel in _panels(json.loads(path.read_text())["panels"])
        for target in panel.get("targets", [])
        if target.get("expr")
    ]


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Each panel, and those inside a collapsed row."""
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def grafana_filled(expr: str) -> str:
    for name, value in GRAFANA.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"a Grafana variable this test does not fill in: {expr}"
    return expr


@pytest.fixture
def flower(services: Services, tmp_path: Path) -> Iterator[str]:
    """Flower, as the compose service runs it (with a login), watching the test's broker."""
    with running_flower(services.env, FLOWER_LOGIN, tmp_path / "flower.log") as port:
        yield f"127.0.0.1:{port}"
    assert not listening(port)


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[PrometheusServer]:
    """A Prometheus of the test's own, not started yet; stopped (its port free) afterwards."""
    directory = tmp_path / "prometheus"
    directory.mkdir()
    server = PrometheusServer(directory)
    yield server
    server.stop()


def _sent(prometheus: PrometheusServer) -> tuple[float, float]:
    """Sends counted in the latest scrape, and the time of the query."""
    result = prometheus.query('sum(notifier_attempts_total{outcome="sent"})')
    return (float(result[0]["value"][1]), float(result[0]["value"][0])) if result else (0.0, 0.0)


def _numbers(result: list[dict[str, Any]]) -> bool:
    """At least one series, each value a number: a rate that has not risen in its window makes
    ``histogram_quantile`` and the failure ratio NaN, which a panel shows as no data."""
    return bool(result) and all(not math.isnan(float(r["value"][1])) for r in result)


@pytest.mark.timeout(240)
def test_every_dashboard_query_returns_data_and_the_rules_load(
    services: Services,
    flower: str,
    prometheus: PrometheusServer,
    engine: Engine,
    redis_url: str,
    make_row: MakeRow,
) -> None:
    queries = [(where, grafana_filled(expr)) for where, expr in dashboard_queries()]
    assert len(queries) >= 10, queries
    client = redis.Redis.from_url(redis_url)
    labels = metrics.Labels.of(load_registry(get_settings()))
    targets = {"notifier": serve(engine, client, labels), "flower": flower}
    targets["prometheus"] = prometheus.address
    prometheus.start(local_config(prometheus.directory, targets, {"flower": FLOWER_LOGIN}))

    def wave() -> None:
        for recipient in ("a", "b", "c"):
            make_row(channel="null", recipient=recipient)
        make_row(channel="pigeon", recipient="d")  # no provider serves it: dead

    wave()
    services.worker()
    services.beat()
    prometheus.wait_for(lambda: _sent(prometheus)[0] >= 3, 90, "a scrape of the first sends")
    every_job_up = {"notifier": "1", "flower": "1", "prometheus": "1"}
    prometheus.wait_for(
        lambda: {r["metric"]["job"]: r["value"][1] for r in prometheus.query("up")} == every_job_up,
        30,
        "a scrape of every job, Flower's with its login",
    )
    silent: dict[str, str] = {}

    def every_query_answers() -> bool:  # each series exists, each rate has two samples
        silent.clear()
        silent.update({w: e for w, e in queries if not prometheus.query(e)})
        return not silent

    try:
        prometheus.wait_for(every_query_answers, 60, "every dashboard query to answer")
    except AssertionError:
        raise AssertionError(f"queries without data: {silent}") from None

    # The second sends raise every counter after a scrape has seen the first: at the moment
    # they are scraped, every rate has risen in its window, and no panel may show NaN.
    wave()
    scraped: list[float] = []

    def second_sends_scraped() -> bool:
        sent, at = _sent(prometheus)
        scraped.append(at)
        return sent >= 6

    prometheus.wait_for(second_sends_scraped, 60, "a scrape of the second sends")
    answers = {where: prometheus.query(expr, at=scraped[-1]) for where, expr in queries}
    assert {where: a for where, a in answers.items() if not _numbers(a)} == {}

    names = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}

    def rules_evaluated() -> bool:
        rules = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
        return bool(rules) and all(r["health"] != "unknown" for r in rules)

    prometheus.wait_for(rules_evaluated, 30, "every rule to be evaluated once")
    rules = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
    assert {r["name"] for r in rules} == names
    assert [
        (r["name"], r["health"], r.get("lastError")) for r in rules if r["health"] != "ok"
    ] == []
    client.close()
