"""The README's walkthrough, its shell blocks run as written, and the two commands on a clone.

The blocks are the README's fenced ``sh`` blocks whose first line is ``# walkthrough: ...``, in
order. They run in a second "terminal" (bash, ``-e -o pipefail``, in a folder whose ``.venv`` is
this run's), each after the setup block, as pasted one after the other, while what
``scripts/dev --webhooks --guard`` runs is up: a worker, beat, an SMTP sink, and
scripts/devservers.py's receiver and guard, on free ports named by the same ``DEV_*_PORT``
variables the blocks read, against this test's own database and Redis. After each block the
test checks what it promised: the email and webhook arrived, the reminder ended cancelled,
the guard held its row back, the campaign was sent, the console answered.

The second test clones this repository and runs ``scripts/dev migrate`` then ``scripts/test
--lint-only`` in it, as the README's Quick start orders them (pip installs into the clone's
own .venv: minutes).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text

from tests.acceptance.conftest import REPO, Services, wait_for
from tests.conftest import POSTGRES
from tests.smtp_sink import SmtpSink

BLOCK = re.compile(r"^```sh\n# walkthrough: (?P<title>[^\n]*)\n(?P<body>.*?)^```", re.M | re.S)


def walkthrough() -> list[tuple[str, str]]:
    return [(m["title"], m["body"]) for m in BLOCK.finditer((REPO / "README.md").read_text())]


#: (ports, the second terminal's environment, the settings scripts/dev writes into .dev.env)
Dev = tuple[dict[str, int], dict[str, str], dict[str, str]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return int(r.status), r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""
    except OSError:
        return 0, b""


class Terminal:
    """The second terminal: bash in a folder with this run's .venv, the user's environment."""

    def __init__(
        self, home: Path, env: dict[str, str], dev_env: dict[str, str], setup: str
    ) -> None:
        self.cwd = home / "checkout"
        self.cwd.mkdir()
        (self.cwd / ".venv").symlink_to(Path(sys.prefix))
        # What scripts/dev writes at start: the settings its worker runs with.
        (self.cwd / ".dev.env").write_text(
            "".join(f"export {name}={shlex.quote(value)}\n" for name, value in dev_env.items())
        )
        self.env = env
        self.setup = setup

    def command(self, body: str) -> list[str]:
        return ["bash", "-e", "-o", "pipefail", "-c", f"{self.setup}\n{body}"]

    def run(self, title: str, body: str) -> str:
        done = subprocess.run(
            self.command(body),
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"{title!r} exited {done.returncode}:\n{done.stderr}"
        return done.stdout


@pytest.fixture
def dev(services: Services, tmp_path: Path) -> Iterator[Dev]:
    """What ``scripts/dev --webhooks --guard`` runs, on free ports: yields (ports, user env,
    the settings scripts/dev writes into .dev.env)."""
    ports = {"hooks": free_port(), "guard": free_port(), "console": free_port()}
    dev_env = {
        "NOTIFIER_DATABASE_URL": services.env["NOTIFIER_DATABASE_URL"],
        "NOTIFIER_REDIS_URL": services.env["NOTIFIER_REDIS_URL"],
        "NOTIFIER_WEBHOOK_ALLOW_HTTP": "true",
        "NOTIFIER_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8,::1/128",
        "NOTIFIER_GUARD_HTTP_URL": f"http://127.0.0.1:{ports['guard']}/check",
    }
    services.env.update(dev_env, NOTIFIER_DISPATCH_INTERVAL="5")
    servers = [
        subprocess.Popen(
            [sys.executable, "scripts/devservers.py", role, "--port", str(ports[name])],
            cwd=REPO,
            start_new_session=True,
        )
        for name, role in (("hooks", "receiver"), ("guard", "guard"))
    ]
    try:
        services.worker()
        services.beat()
        for name in ("hooks", "guard"):
            url = f"http://127.0.0.1:{ports[name]}/received"
            wait_for(lambda url=url: get(url)[0] == 200, 30, f"the {name} server")
        user = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "PYTHONPATH")}
        # A new terminal knows no notifier until .venv is activated.
        path = os.environ["PATH"].split(os.pathsep)
        user["PATH"] = os.pathsep.join(d for d in path if not (Path(d) / "notifier").exists())
        user.update(
            NOTIFIER_CONSOLE_PORT=str(ports["console"]),
            DEV_WEBHOOKS_PORT=str(ports["hooks"]),
            DEV_GUARD_PORT=str(ports["guard"]),
        )
        yield ports, user, dev_env
    finally:
        for server in servers:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=10)


def row(engine: Engine, where: str, **params: object) -> dict[str, object]:
    with engine.connect() as conn:
        found = conn.execute(
            text(f"SELECT status, last_error FROM notifications WHERE {where}"), params
        ).one()
    return dict(found._mapping)


@pytest.mark.timeout(600)
def test_the_walkthrough_works_as_written(
    dev: Dev,
    smtp_sink: SmtpSink,
    engine: Engine,
    tmp_path: Path,
) -> None:
    ports, env, dev_env = dev
    blocks = walkthrough()
    titles = [title for title, _ in blocks]
    assert titles == [
        "setup",
        "an email",
        "a webhook",
        "a delayed reminder, cancelled",
        "a guard",
        "a campaign",
        "the console, until Ctrl-C",
    ]
    (_, setup), *steps = blocks
    assert "source .venv/bin/activate" in setup
    assert "source .dev.env" in setup
    terminal = Terminal(tmp_path, env, dev_env, setup)
    by_title = dict(steps)

    terminal.run("an email", by_title["an email"])
    wait_for(lambda: bool(smtp_sink.delivered_to("ann@example.com")), 30, "the email")
    (mail,) = smtp_sink.delivered_to("ann@example.com")
    assert "My first notification." in mail.message.get_content()

    out = terminal.run("a webhook", by_title["a webhook"])
    hooks = f"http://127.0.0.1:{ports['hooks']}/received"
    wait_for(lambda: b"/orders" in get(hooks)[1], 30, "the webhook")
    (hook,) = json.loads(get(hooks)[1])
    assert json.loads(hook["body"])["payload"] == {"order": 1042}
    assert '"/orders"' in out  # the block's own curl showed it

    terminal.run("a delayed reminder", by_title["a delayed reminder, cancelled"])
    reminder = row(engine, "dedupe_key = :k", k="confirm-reminder:ann")
    assert reminder == {"status": "cancelled", "last_error": "ann confirmed"}

    terminal.run("a guard", by_title["a guard"])
    guarded = "recipient = 'user42@example.com'"
    wait_for(lambda: row(engine, guarded)["status"] != "pending", 30, "the guard's answer")
    assert row(engine, guarded) == {
        "status": "cancelled",
        "last_error": "guard http: user 42 confirmed",
    }
    assert smtp_sink.delivered_to("user42@example.com") == []

    terminal.run("a campaign", by_title["a campaign"])
    with engine.connect() as conn:
        sent = conn.execute(
            text(
                "SELECT n.recipient, n.status FROM notifications n "
                "JOIN campaigns c ON c.id = n.campaign_id WHERE c.name = 'spring' ORDER BY 1"
            )
        ).all()
    assert [tuple(r) for r in sent] == [("ann@example.com", "sent"), ("bob@example.com", "sent")]
    wait_for(lambda: bool(smtp_sink.delivered_to("bob@example.com")), 30, "Bob's campaign email")
    assert "A gift for you, Bob" in str(smtp_sink.delivered_to("bob@example.com")[0].message)

    console = subprocess.Popen(
        terminal.command(by_title["the console, until Ctrl-C"]),
        cwd=terminal.cwd,
        env=env,
        start_new_session=True,
    )
    try:
        login = f"http://127.0.0.1:{ports['console']}/login"
        wait_for(lambda: get(login)[0] == 200 or console.poll() is not None, 60, "the console")
        assert console.poll() is None, f"the console exited {console.returncode}"
    finally:
        os.killpg(console.pid, signal.SIGINT)  # Ctrl-C
        console.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_fresh_clone_runs_the_two_commands_in_the_readme_order(tmp_path: Path) -> None:
    clone = tmp_path / "notifier"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True, timeout=120)
    name = f"notifier_clone_{uuid.uuid4().hex[:12]}"
    # The clone's own code and .venv only: nothing of this run's virtualenv or settings.
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    env["NOTIFIER_DATABASE_URL"] = f"{POSTGRES}/{name}"
    admin = create_engine(f"{POSTGRES}/postgres", isolation_level="AUTOCOMMIT")

    def run(*cmd: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            cmd, cwd=clone, env={**env, **extra}, capture_output=True, text=True, timeout=1500
        )

    try:
        migrated = run("scripts/dev", "migrate")
        assert migrated.returncode == 0, migrated.stdout + migrated.stderr
        assert f"database {name} is at the newest schema" in migrated.stdout
        assert " INFO " not in migrated.stdout + migrated.stderr
        checked = run("scripts/test", "--lint-only")
        assert checked.returncode == 0, checked.stdout[-5000:] + checked.stderr[-5000:]
        assert "==> all passed" in checked.stdout

        # A database that is not there: the message names the URL's host and port, not
        # localhost:5432, never its password, and without Alembic's INFO lines.
        port = free_port()
        wrong = run(
            "scripts/dev",
            "migrate",
            NOTIFIER_DATABASE_URL=f"postgresql://u:s3cret@127.0.0.1:{port}/x",
        )
        said = wrong.stdout + wrong.stderr
        assert wrong.returncode == 1, said
        assert f"could not migrate the database at 127.0.0.1:{port}/x" in said
        assert "s3cret" not in said
        assert "5432" not in said
        assert " INFO " not in said
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()
