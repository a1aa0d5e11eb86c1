"""A Prometheus of one test's own: Debian's ``/usr/bin/prometheus`` on a free loopback port, with
a config and data directory in the test's temporary directory, read through its HTTP API.

The config is the shipped one (``deploy/prometheus/prometheus.yml``), loaded and pointed at the
test's own targets by ``local_config``, so the test scrapes the jobs and evaluates the rules an
operator gets. It is written as JSON, which Prometheus reads as the YAML it is.

CI installs the package (``.ci/run``); elsewhere the tests that need it are skipped when it is
missing (``needs_prometheus``), as the browser tests are without chromium.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.server_process import free_port, listening

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy" / "prometheus"
CONFIG = DEPLOY / "prometheus.yml"
RULES = DEPLOY / "alerts.yml"
RULE_TESTS = DEPLOY / "alerts_test.yml"
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")

needs_prometheus = pytest.mark.skipif(
    (PROMETHEUS is None or PROMTOOL is None) and not os.environ.get("CI"),
    reason="Prometheus is not installed (apt-get install prometheus); CI installs it",
)


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``promtool ARGS``, run to the end; a non-zero exit is returned, not raised, as the tests
    that break a rule on purpose expect one."""
    assert PROMTOOL is not None, "promtool is not installed (apt-get install prometheus)"
    return subprocess.run(
        [PROMTOOL, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def without_username_files(config: dict[str, Any], username: str) -> dict[str, Any]:
    """``config`` with each ``basic_auth.username_file`` replaced by ``username`` inline.

    Debian 12's Prometheus (2.42) predates ``username_file`` and refuses a whole config over
    it; the compose image (2.55) reads it."""
    for job in config.get("scrape_configs", []):
        auth = job.get("basic_auth")
        if auth and auth.pop("username_file", None) is not None:
            auth["username"] = username
    return config


def local_config(
    directory: Path,
    targets: Mapping[str, str],
    logins: Mapping[str, tuple[str, str]],
    interval: str = "1s",
) -> dict[str, Any]:
    """The shipped config, each job scraping ``targets[job]`` (every job must have one) every
    ``interval``, with ``logins[job]`` where the job sends one (its password in a file in
    ``directory``), and the rules by absolute path."""
    config: dict[str, Any] = yaml.safe_load(CONFIG.read_text())
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert jobs == set(targets), f"the shipped jobs are {sorted(jobs)}"
    config["global"].update(
        scrape_interval=interval, evaluation_interval=interval, scrape_timeout=interval
    )
    config["rule_files"] = [str(DEPLOY / name) for name in config["rule_files"]]
    for job in config["scrape_configs"]:
        name = job["job_name"]
        job["static_configs"] = [{"targets": [targets[name]]}]
        if "basic_auth" in job:
            user, password = logins[name]
            (directory / f"{name}-password").write_text(password)
            job["basic_auth"]["password_file"] = str(directory / f"{name}-password")
            without_username_files({"scrape_configs": [job]}, user)
    return config


class PrometheusServer:
    """``prometheus`` with ``config`` (see ``local_config``) in ``directory``; ``start``, the
    API's answers, ``stop``. Its own job, if the config has one, should scrape ``address``."""

    def __init__(self, directory: Path, port: int | None = None) -> None:
        assert PROMETHEUS is not None, "prometheus is not installed (apt-get install prometheus)"
        self.binary = PROMETHEUS
        self.directory = directory
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.http = httpx.Client(base_url=f"http://{self.address}", timeout=10)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.directory / "prometheus.log"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start(self, config: Mapping[str, Any], timeout: float = 30) -> PrometheusServer:
        """Write ``config``, start Prometheus, and return once it says it is ready."""
        config_path = self.directory / "prometheus.json"
        config_path.write_text(json.dumps(config, indent=2))
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={config_path}",
                    f"--storage.tsdb.path={self.directory / 'data'}",
                    f"--web.listen-address={self.address}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.wait_for(self._ready, timeout, "Prometheus to be ready")
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        assert self.proc.poll() is None, (
            f"Prometheus exited ({self.proc.returncode}):\n{self.log()[-3000:]}"
        )
        try:
            return self.http.get("/-/ready").status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> None:
        """SIGTERM (SIGKILL after 15 s), and wait until its port is free again."""
        self.http.close()
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None
        assert not listening(self.port), f"port {self.port} still open after Prometheus stopped"

    def api(self, path: str, **params: str) -> Any:
        """The ``data`` of ``/api/v1/<path>``; fails the test on an API error."""
        answer = self.http.get(f"/api/v1/{path}", params=params).json()
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result, now or ``at`` (Unix time): one ``{"metric": ...,
        "value": [t, "v"]}`` per series."""
        data = self.api("query", query=expr, **({} if at is None else {"time": str(at)}))
        assert data["resultType"] == "vector", data
        return list(data["result"])

    def wait_for(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll ``predicate`` until it holds; fail naming ``what`` (and the log) on timeout."""
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, (
                f"timed out after {timeout}s waiting for {what}\n{self.log()[-3000:]}"
            )
            time.sleep(0.2)
