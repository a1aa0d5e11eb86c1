"""The trial stack (deploy/trial/compose.yml) with the README's own up and down commands.

Up, one email INSERTed by plain SQL and seen by the mail catcher, then ``down -v``: no
container, volume or network of the project is left. The project name and the host ports are
the only differences from the README's commands (``-p``, empty ports: free ones), so the test
clashes with no trial an operator runs on this machine.
"""

from __future__ import annotations

import json
import os
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.compose.test_compose import IMAGE_TAG, ROOT, _run, container_engine, wait_for

__all__ = ["container_engine"]  # the fixture, shared with test_compose.py

pytestmark = [pytest.mark.slow, pytest.mark.compose, pytest.mark.timeout(1800)]

TRIAL = ["-f", "deploy/trial/compose.yml"]
HOST_PORTS = ("FLOWER", "METRICS", "EVENTS", "CONSOLE", "POSTGRES", "TRIAL_MAIL", "TRIAL_WEBHOOKS")


class Trial:
    def __init__(self) -> None:
        self.project = f"notifier-trial-test-{uuid.uuid4().hex[:10]}"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFIER_")}
        self.env.update({f"{name}_HOST_PORT": "" for name in HOST_PORTS}, IMAGE_TAG=IMAGE_TAG)

    def compose(self, *args: str, check: bool = True) -> str:
        cmd = ["docker", "compose", "-p", self.project, *TRIAL, *args]
        done = _run(cmd, timeout=900, env=self.env, cwd=ROOT)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {done.returncode}:\n{done.stderr}")
        return done.stdout

    def left(self) -> dict[str, list[str]]:
        label = f"label=com.docker.compose.project={self.project}"
        return {
            kind: _run(["docker", *command, "--filter", label, "-q"]).stdout.split()
            for kind, command in {
                "containers": ["ps", "-a"],
                "volumes": ["volume", "ls"],
                "networks": ["network", "ls"],
            }.items()
        }


@pytest.fixture
def trial(container_engine: None) -> Iterator[Trial]:
    t = Trial()
    try:
        yield t
    finally:
        t.compose("down", "-v", "--remove-orphans", "--timeout", "30", check=False)
        _run(["docker", "rmi", f"notifier:{IMAGE_TAG}", f"notifier-devservers:{IMAGE_TAG}"])


def test_trial_stack_catches_an_email_and_down_removes_everything(trial: Trial) -> None:
    trial.compose("up", "-d", "--wait", "--wait-timeout", "600")
    trial.compose(
        *("exec", "-T", "postgres", "psql", "-U", "postgres", "-d", "notifier", "-c"),
        "INSERT INTO notifications (channel, recipient, subject, body) "
        "VALUES ('email', 'ann@example.com', 'hi', 'hello from the trial')",
    )
    address = trial.compose("port", "mailcatcher", "8080").strip()

    def caught() -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"http://{address}/received", timeout=30) as r:
            return list(json.load(r))

    wait_for("the email in the mail catcher", lambda: bool(caught()), timeout=120)
    (mail,) = caught()
    assert mail["rcpt_tos"] == ["ann@example.com"]
    assert "hello from the trial" in mail["data"]
    assert trial.left()["containers"]

    # The README's down command, as written (plus the project name): nothing of it is left.
    trial.compose("down", "-v")
    assert trial.left() == {"containers": [], "volumes": [], "networks": []}
