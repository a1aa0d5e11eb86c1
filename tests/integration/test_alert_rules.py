"""The alerting rules (deploy/prometheus/alerts.yml) as promtool reads them: valid, wired into the
shipped config and the compose service, and covered by unit tests that fail when a rule is wrong.

The unit tests themselves are deploy/prometheus/alerts_test.yml; here they are run, then run
again against rule files broken on purpose, each of which they must reject: a test file that
passes whatever the rules say would prove nothing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.prometheus_server import (
    CONFIG,
    REPO,
    RULE_TESTS,
    RULES,
    needs_prometheus,
    promtool,
    without_username_files,
)

pytestmark = needs_prometheus


def _load(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(path.read_text())
    return loaded


def _rules() -> list[dict[str, Any]]:
    return [rule for group in _load(RULES)["groups"] for rule in group["rules"]]


ALERTS = [rule["alert"] for rule in _rules()]


def _unit_tests_against(rules: dict[str, Any], directory: Path) -> str:
    """Run the unit tests against ``rules`` (written beside a copy of the test file, where it
    looks for them); promtool's output if they fail, "" if they pass."""
    shutil.copy(RULE_TESTS, directory / RULE_TESTS.name)
    (directory / RULES.name).write_text(json.dumps(rules))
    done = promtool("test", "rules", directory / RULE_TESTS.name)
    return "" if done.returncode == 0 else done.stdout + done.stderr


def test_the_rules_pass_promtool_check() -> None:
    done = promtool("check", "rules", RULES)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in done.stdout


def test_the_unit_tests_pass() -> None:
    done = promtool("test", "rules", RULE_TESTS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_shipped_config_loads_the_rules(tmp_path: Path) -> None:
    """``promtool check config`` resolves ``rule_files`` beside the config and checks them too.

    Debian 12's promtool refuses the Flower job's ``username_file`` (newer than it; the compose
    image reads it): then the same config with the name inline must pass, and that must be the
    only complaint."""
    done = promtool("check", "config", CONFIG)
    if done.returncode != 0:
        assert "field username_file not found" in done.stdout + done.stderr, done.stdout
        copy = tmp_path / CONFIG.name
        copy.write_text(json.dumps(without_username_files(_load(CONFIG), "flower")))
        shutil.copy(RULES, tmp_path / RULES.name)
        done = promtool("check", "config", copy)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in done.stdout


def test_compose_mounts_the_rules_where_the_config_looks_for_them() -> None:
    prometheus = _load(REPO / "docker-compose.yml")["services"]["prometheus"]
    assert prometheus["profiles"] == ["monitoring"]
    mounts = dict(volume.split(":")[:2] for volume in prometheus["volumes"])
    config = Path(mounts["./deploy/prometheus/prometheus.yml"])
    for name in _load(CONFIG)["rule_files"]:
        assert mounts[f"./deploy/prometheus/{name}"] == str(config.parent / name)


@pytest.mark.parametrize("rule", _rules(), ids=lambda rule: rule["alert"])
def test_each_alert_waits_is_graded_and_tells_what_to_look_at(rule: dict[str, Any]) -> None:
    assert rule["for"], "a blip must not page anybody"
    assert rule["labels"]["severity"] in ("critical", "warning")
    assert rule["annotations"]["summary"]
    assert len(rule["annotations"]["description"]) > 80


def test_promtool_rejects_a_broken_rule(tmp_path: Path) -> None:
    broken = tmp_path / "alerts.yml"
    broken.write_text(
        RULES.read_text().replace("notifier_lag_seconds > 170", "notifier_lag_seconds >")
    )
    done = promtool("check", "rules", broken)
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert '"NotifierLagging": could not parse expression' in said, said


def test_the_unit_tests_catch_a_wrong_threshold(tmp_path: Path) -> None:
    rules = _load(RULES)
    for rule in rules["groups"][0]["rules"]:
        rule["expr"] = rule["expr"].replace("> 170", "> 1700")
    failed = _unit_tests_against(rules, tmp_path)
    assert "alertname: NotifierLagging" in failed
    assert "alertname: NotifierDeadRate" not in failed  # only what changed


def test_each_alert_has_cases_that_fire_and_cases_that_stay_quiet() -> None:
    cases: dict[str, set[bool]] = {alert: set() for alert in ALERTS}
    for group in _load(RULE_TESTS)["tests"]:
        for case in group["alert_rule_test"]:
            cases[case["alertname"]].add(bool(case["exp_alerts"]))
    assert {alert: kinds for alert, kinds in cases.items() if kinds != {True, False}} == {}


@pytest.mark.parametrize("alert", ALERTS)
@pytest.mark.parametrize(
    ("change", "missed"),
    [
        ({"expr": "vector(1) == 0"}, "its firing cases are not checked"),
        ({"for": "0s"}, "nothing checks that it waits"),
    ],
    ids=["never-fires", "fires-at-once"],
)
def test_the_unit_tests_notice_an_alert_that_never_fires_or_does_not_wait(
    alert: str, change: dict[str, str], missed: str, tmp_path: Path
) -> None:
    rules = _load(RULES)
    for rule in rules["groups"][0]["rules"]:
        if rule["alert"] == alert:
            rule.update(change)
    failed = _unit_tests_against(rules, tmp_path)
    assert f"alertname: {alert}," in failed, f"{alert}: {missed} (alerts_test.yml)"
