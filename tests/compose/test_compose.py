"""The production stack for real: docker-compose.yml built, brought up and used like an operator.

The steps are docs/production.md's: build the image, ``up -d --wait``, rows
INSERTed by plain SQL, ``--scale worker=3``, a worker killed mid-drain, ``down`` then ``up``.
tests/compose/compose.override.yml adds a mail catcher and a webhook receiver. Everything runs
under a compose project of its own and is removed at the end (``down -v``), also on failure.

Needs a container engine: if ``docker`` is not usable, ``../shared/container-engine/setup`` is
run; only when there is no engine at all is the module skipped, loudly.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.compose, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
OVERRIDE = ROOT / "tests" / "compose" / "compose.override.yml"
ENGINE_SETUP = ROOT.parent / "shared" / "container-engine" / "setup"
# Tagged per checkout, so two checkouts sharing a daemon do not run each other's code.
IMAGE_TAG = "compose-test-" + uuid.uuid5(uuid.NAMESPACE_URL, str(ROOT)).hex[:8]
FLOWER_LOGIN = ("ops", uuid.uuid4().hex)
QA_ADDRESS = "qa@catcher.example"
BATCH_SIZE = 50
# The default lease: a killed worker's rows must come back through its stopped heartbeat, long
# before the lease would give them back.
LEASE_SECONDS = 300
#: How soon they must be back: three heartbeats (5 s each) of grace, then a rescue, with room.
RESCUED_WITHIN = 60
DRAIN_ROWS = 5000
WEBHOOK_KEY = uuid.uuid4().bytes
WEBHOOK_SECRET = "whsec_" + base64.b64encode(WEBHOOK_KEY).decode()
SERVICES = ("worker", "beat", "flower", "metrics")


def _run(cmd: list[str], timeout: float = 600, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, **kw)


def _docker_usable() -> bool:
    if shutil.which("docker") is None:
        return False
    return (
        _run(["docker", "info"], timeout=60).returncode == 0
        and _run(["docker", "compose", "version"], timeout=60).returncode == 0
    )


@pytest.fixture(scope="session")
def container_engine() -> None:
    if _docker_usable():
        return
    if not ENGINE_SETUP.exists():
        pytest.skip(f"NO CONTAINER ENGINE: docker is not usable and {ENGINE_SETUP} is missing")
    setup = _run([str(ENGINE_SETUP)], timeout=1200, cwd=ROOT)
    if not _docker_usable():
        pytest.skip(
            "NO CONTAINER ENGINE: docker is not usable even after "
            f"{ENGINE_SETUP} (exit {setup.returncode}): {setup.stderr[-2000:]}"
        )


def wait_for(what: str, check: Callable[[], bool], timeout: float = 300, every: float = 1) -> float:
    """Seconds until ``check()`` held; fails after ``timeout`` seconds."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(every)
    return time.monotonic() - start


@dataclass
class Stack:
    """One compose project: ``docker compose -p <project> -f docker-compose.yml -f override``."""

    project: str
    env_file: Path
    secrets_dir: Path

    def compose(self, *args: str, check: bool = True, timeout: float = 900) -> str:
        cmd = ["docker", "compose", "-p", self.project, "--env-file", str(self.env_file)]
        cmd += ["-f", str(ROOT / "docker-compose.yml"), "-f", str(OVERRIDE), *args]
        # Only the env file configures the stack: none of this shell's NOTIFIER_* settings.
        env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFIER_")}
        env.update(ENV_FILE=str(self.env_file), SECRETS_DIR=str(self.secrets_dir))
        done = _run(cmd, timeout=timeout, env=env, cwd=ROOT)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {done.returncode}:\n{done.stderr}")
        return done.stdout

    def sql(self, query: str) -> str:
        return self.compose(
            *("exec", "-T", "postgres", "psql", "-U", "postgres", "-d", "notifier"),
            *("-Atq", "-v", "ON_ERROR_STOP=1", "-c", query),
        ).strip()

    def url(self, service: str, port: int, path: str) -> str:
        address = self.compose("port", service, str(port)).strip()  # 127.0.0.1:49153
        return f"http://{address}{path}"

    def received(self, service: str) -> list[dict[str, Any]]:
        with urllib.request.urlopen(self.url(service, 8080, "/received"), timeout=30) as r:
            return list(json.load(r))

    def containers(self, service: str) -> list[str]:
        return self.compose("ps", "-q", service).split()

    def health(self) -> dict[str, str]:
        rows = [json.loads(line) for line in self.compose("ps", "--format", "json").splitlines()]
        return {row["Name"]: row.get("Health") or row["State"] for row in rows}


def delivered_once_outside_the_windows(
    stack: Stack, subject: str, path: str, rows: int
) -> tuple[set[str], dict[str, str]]:
    """Checks that each row reached the receiver, and twice only inside a window.

    docs/guarantees.md names the two windows in which a second delivery is allowed: a row taken
    back from a worker that stopped (rescues > 0), or an answer lost on the network and the row
    retried (attempts > 1). Returns the rows delivered more than once and each windowed row's
    window; a row outside them fails with its history.
    """
    deliveries = Counter(h["id"] for h in stack.received("webhooks") if h["path"] == path)
    assert len(deliveries) == rows
    duplicated = {i for i, n in deliveries.items() if n > 1}
    windows = dict(
        line.split("|")
        for line in stack.sql(
            "SELECT 'notification-' || id, CASE WHEN rescues > 0 THEN 'rescued' ELSE 'retried' END "
            f"FROM notifications WHERE subject = '{subject}' AND (rescues > 0 OR attempts > 1)"
        ).splitlines()
    )
    outside = sorted(duplicated - set(windows))[:20]
    if outside:
        ids = ", ".join(i.removeprefix("notification-") for i in outside)
        history = stack.sql(
            "SELECT notification_id, attempt, outcome, worker, error FROM notification_attempts "
            f"WHERE notification_id IN ({ids}) ORDER BY 1, 2"
        )
        raise AssertionError(f"delivered twice outside the windows: {outside}\n{history}")
    return duplicated, windows


def _http_status(url: str, auth: tuple[str, str] | None = None) -> int:
    request = urllib.request.Request(url)
    if auth:
        token = base64.b64encode(":".join(auth).encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code


@pytest.fixture(scope="module")
def stack(container_engine: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("compose")
    secrets = home / "secrets"
    secrets.mkdir()
    # The image's user (uid 10001) reads these through the bind mount.
    (secrets / "notifier_webhook_secret").write_text(WEBHOOK_SECRET + "\n")
    secrets.chmod(0o755)
    for f in secrets.iterdir():
        f.chmod(0o644)
    env_file = home / ".env"
    env_file.write_text(
        "\n".join(
            [
                f"IMAGE_TAG={IMAGE_TAG}",
                f"POSTGRES_PASSWORD={uuid.uuid4().hex}",
                "FLOWER_BASIC_AUTH={}:{}".format(*FLOWER_LOGIN),
                # Empty: free loopback ports, so nothing clashes with this host's services.
                "FLOWER_HOST_PORT=",
                "METRICS_HOST_PORT=",
                "POSTGRES_HOST_PORT=",
                "EVENTS_HOST_PORT=",
                "CONSOLE_HOST_PORT=",
                "NOTIFIER_SMTP_HOST=mailcatcher",
                "NOTIFIER_SMTP_PORT=1025",
                "NOTIFIER_EMAIL_FROM=notifier@compose.example",
                f"NOTIFIER_OVERRIDE_RECIPIENTS=email={QA_ADDRESS}",
                f"NOTIFIER_BATCH_SIZE={BATCH_SIZE}",
                f"NOTIFIER_LEASE_SECONDS={LEASE_SECONDS}",
                "NOTIFIER_DISPATCH_INTERVAL=2",
                # The webhook receiver is a plain-http container on the compose network.
                "NOTIFIER_WEBHOOK_ALLOW_HTTP=true",
                "NOTIFIER_WEBHOOK_ALLOWED_NETWORKS=10.0.0.0/8,172.16.0.0/12,192.168.0.0/16",
                "",
            ]
        )
    )
    s = Stack(f"notifier-test-{uuid.uuid4().hex[:10]}", env_file, secrets)
    try:
        started = time.monotonic()
        s.compose("build")
        built = time.monotonic()
        s.compose("up", "-d", "--wait", "--wait-timeout", "600")
        print(f"compose: build {built - started:.0f} s, up --wait {time.monotonic() - built:.0f} s")
        yield s
    finally:
        logs = s.compose("logs", "--no-color", "--tail", "200", check=False, timeout=120)
        # Outside pytest's temporary folders, which other runs on this machine rotate away.
        saved = Path(tempfile.gettempdir()) / f"{s.project}.log"
        saved.write_text(logs)
        print(f"compose logs: {saved}")
        down = ("down", "-v", "--remove-orphans", "--timeout", "30")
        s.compose("--profile", "pgbouncer", *down, check=False)
        images = ("notifier", "notifier-devservers", "notifier-pgbouncer")
        _run(["docker", "rmi", *(f"{image}:{IMAGE_TAG}" for image in images)])


def test_migrate_ran_once_and_reruns_harmlessly(stack: Stack) -> None:
    ps = [json.loads(line) for line in stack.compose("ps", "-a", "--format", "json").splitlines()]
    migrate = [row for row in ps if row["Service"] == "migrate"]
    assert [(row["State"], row["ExitCode"]) for row in migrate] == [("exited", 0)]
    out = stack.compose("run", "--rm", "migrate")
    assert "at the newest schema" in out
    assert stack.sql("SELECT count(*) FROM notifications") == "0"


def test_every_service_is_healthy_and_flower_asks_for_a_login(stack: Stack) -> None:
    health = stack.health()
    for service in SERVICES:
        (state,) = [v for k, v in health.items() if k.startswith(f"{stack.project}-{service}-")]
        assert state == "healthy", (service, health)
    flower = stack.url("flower", 5555, "/")
    assert _http_status(flower) == 401
    assert _http_status(flower, auth=FLOWER_LOGIN) == 200
    assert _http_status(flower, auth=("ops", "wrong")) == 401
    with urllib.request.urlopen(stack.url("metrics", 9808, "/metrics"), timeout=30) as r:
        assert b"notifier_lag_seconds" in r.read()


def test_settings_only_in_env_and_secret_files_reach_every_container(stack: Stack) -> None:
    probe = (
        "from notifier.settings import get_settings as g; s = g(); "
        "print(s.batch_size, s.lease_seconds, "
        "*(f'{c}={r}' for c, r in s.override_recipients.items()), s.smtp_host, "
        "s.database_url.split('@')[1], bool(s.webhook_secret))"
    )
    expected = (
        f"{BATCH_SIZE} {LEASE_SECONDS} email={QA_ADDRESS} mailcatcher postgres:5432/notifier True"
    )
    for service in SERVICES:
        assert stack.compose("exec", "-T", service, "python", "-c", probe).strip() == expected
    # `run` builds first (pull_policy: build) and may print the build before the probe's line.
    ran = stack.compose("run", "--rm", "migrate", "python", "-c", probe)
    assert ran.strip().splitlines()[-1] == expected


def test_rows_inserted_by_sql_reach_their_final_state(stack: Stack) -> None:
    ids = stack.sql(
        "INSERT INTO notifications (channel, recipient, subject, body, payload) VALUES "
        "('null', 'nobody', 'n', 'n', '{}'), "
        "('email', 'ann@example.com', 'Your receipt', 'Thanks for order 1042.', '{}'), "
        "('webhook', 'http://webhooks:8080/orders', 'order.paid', NULL, '{\"order\": 1042}') "
        "RETURNING id"
    ).split()
    listed = ",".join(ids)

    def finished() -> bool:
        rows = f"FROM notifications WHERE id IN ({listed})"
        statuses = stack.sql(f"SELECT status {rows} ORDER BY id").split()
        assert "dead" not in statuses, stack.sql(f"SELECT * {rows}")
        return statuses == ["sent"] * 3

    wait_for("three rows sent", finished, timeout=120)
    (mail,) = stack.received("mailcatcher")
    # NOTIFIER_OVERRIDE_RECIPIENTS, set only in .env, redirected it.
    assert mail["rcpt_tos"] == [QA_ADDRESS]
    assert "Thanks for order 1042." in mail["data"]
    (hook,) = stack.received("webhooks")
    assert hook["path"] == "/orders"
    assert hook["id"] == f"notification-{ids[2]}"
    assert json.loads(hook["body"])["payload"] == {"order": 1042}
    # Signed with the key that only the secret file holds.
    signed = f"{hook['id']}.{hook['timestamp']}.{hook['body']}".encode()
    digest = hmac.new(WEBHOOK_KEY, signed, hashlib.sha256).digest()
    assert hook["signature"] == "v1," + base64.b64encode(digest).decode()


def test_three_workers_drain_and_a_killed_one_loses_nothing(stack: Stack) -> None:
    stack.compose("up", "-d", "--wait", "--wait-timeout", "600", "--scale", "worker=3")
    workers = stack.containers("worker")
    assert len(workers) == 3
    hostnames = {c[:12] for c in workers}  # a container's hostname is its short id
    victim = workers[0]

    stack.sql(
        "INSERT INTO notifications (channel, recipient, subject, payload) "
        f"SELECT 'webhook', 'http://webhooks:8080/slow', 'drain', json_build_object('n', n) "
        f"FROM generate_series(1, {DRAIN_ROWS}) AS n"
    )
    held_by_victim = (
        "SELECT count(*) FROM notifications WHERE subject = 'drain' AND status = 'processing' "
        f"AND claimed_by LIKE '{victim[:12]}:%'"
    )
    consumers_sql = (
        "SELECT DISTINCT split_part(a.worker, ':', 1) FROM notification_attempts a "
        "JOIN notifications n ON n.id = a.notification_id "
        "WHERE n.subject = 'drain' AND a.outcome = 'sent'"
    )

    def all_consume_and_victim_holds() -> bool:
        consumers = set(stack.sql(consumers_sql).split())
        return consumers == hostnames and int(stack.sql(held_by_victim)) > 0

    wait_for("all three workers sent rows, the victim holds some", all_consume_and_victim_holds)
    _run(["docker", "kill", "-s", "KILL", victim], timeout=60).check_returncode()
    killed_at = time.monotonic()
    # The fault happened: the container is gone, with rows still claimed by it.
    state = _run(["docker", "inspect", "-f", "{{.State.Running}} {{.State.ExitCode}}", victim])
    assert state.stdout.split() == ["false", "137"]
    held = int(stack.sql(held_by_victim))
    assert held > 0

    # The worker's heartbeat stopped with it: its rows are rescued once the grace (three
    # heartbeats) has passed, by the other workers' dispatches or beat, not after the lease.
    back = wait_for("the killed worker's rows back", lambda: stack.sql(held_by_victim) == "0")
    assert time.monotonic() - killed_at < RESCUED_WITHIN, back

    def drained() -> bool:
        counts = dict(
            line.split("|")
            for line in stack.sql(
                "SELECT status, count(*) FROM notifications WHERE subject = 'drain' GROUP BY 1"
            ).splitlines()
        )
        assert set(counts) <= {"pending", "processing", "sent"}, counts
        return counts == {"sent": str(DRAIN_ROWS)}

    took = wait_for(f"{DRAIN_ROWS} rows sent", drained, timeout=900, every=2)
    duplicated, windows = delivered_once_outside_the_windows(stack, "drain", "/slow", DRAIN_ROWS)
    rescued = {i for i, why in windows.items() if why == "rescued"}
    print(
        f"drain: {DRAIN_ROWS} rows sent {took:.0f} s after the kill; {held} held by the killed "
        f"worker, {len(rescued)} rescued, {len(windows) - len(rescued)} retried, "
        f"{len(duplicated)} delivered more than once ({len(duplicated & rescued)} of them rescued)"
    )


def test_down_then_up_keeps_every_row_and_counter(stack: Stack) -> None:
    def sent_counter() -> float:
        with urllib.request.urlopen(stack.url("metrics", 9808, "/metrics"), timeout=30) as r:
            lines = r.read().decode().splitlines()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in lines
            if line.startswith("notifier_attempts_total{") and 'outcome="sent"' in line
        )

    rows = stack.sql("SELECT status, count(*) FROM notifications GROUP BY 1 ORDER BY 1")
    recorded = int(stack.sql("SELECT count(*) FROM notification_attempts WHERE outcome = 'sent'"))
    assert recorded >= DRAIN_ROWS
    # Every send the history records is counted once it is, except in one crash window: a
    # process killed between recording a group of outcomes and counting it (the earlier test
    # killed a worker's container) leaves that group uncounted. A group is one transaction, so
    # its attempts share their ``at``: the most the counter may lack is the killed processes'
    # last groups (their rows' rescues, appended later under their names, are not theirs).
    killed = stack.sql(
        "SELECT DISTINCT split_part(worker, ':', 1) FROM notification_attempts "
        "WHERE outcome = 'rescued'"
    ).split()
    assert len(killed) == 1, killed
    window = int(
        stack.sql(
            "WITH last AS (SELECT worker, max(at) AS at FROM notification_attempts "
            f"WHERE worker LIKE '{killed[0]}:%' AND outcome <> 'rescued' GROUP BY worker) "
            "SELECT count(*) FROM notification_attempts JOIN last USING (worker, at) "
            "WHERE outcome = 'sent'"
        )
    )
    seen: list[float] = []

    def caught_up() -> bool:
        seen.append(sent_counter())
        return seen[-1] >= recorded - window

    try:
        wait_for("the sent counter to catch up with the history", caught_up, timeout=60)
    except AssertionError as e:
        logs = stack.compose("logs", "--no-color", "worker", check=False, timeout=120)
        warned = [line for line in logs.splitlines() if "metrics" in line][-20:]
        raise AssertionError(
            f"{e}: {recorded} recorded, {window} in the window, {seen[-3:]} "
            f"counted; the workers' warnings: {warned}"
        ) from None
    counted = sent_counter()
    print(f"counters: {recorded} sends recorded, {counted:.0f} counted, {window} in the window")
    stack.compose("down", "--timeout", "60")
    assert stack.containers("postgres") == []
    stack.compose("up", "-d", "--wait", "--wait-timeout", "600")
    assert stack.sql("SELECT status, count(*) FROM notifications GROUP BY 1 ORDER BY 1") == rows
    # Redis keeps its append-only file on a volume: the metrics' counters survive too.
    assert sent_counter() >= counted


def _pgbouncer_transactions(stack: Stack, password: str) -> int:
    """Transactions PgBouncer has passed on to notifier's database, from its admin console."""
    console = f"postgresql://postgres:{password}@pgbouncer:6432/pgbouncer"
    stats = stack.compose(
        *("exec", "-T", "postgres", "psql", console, "-A", "-F", "|", "-c", "SHOW STATS")
    )
    header, *lines = stats.splitlines()
    column = header.split("|").index("total_xact_count")
    counts = [line.split("|") for line in lines if line.startswith("notifier|")]
    assert len(counts) == 1, stats
    return int(counts[0][column])


def test_the_pgbouncer_profile_carries_the_workers(stack: Stack) -> None:
    """docs/pgbouncer.md's steps: three lines in .env, then ``--profile pgbouncer up``."""
    env = dict(
        line.split("=", 1) for line in stack.env_file.read_text().splitlines() if "=" in line
    )
    password = env["POSTGRES_PASSWORD"]
    with stack.env_file.open("a") as f:
        f.write(
            f"NOTIFIER_DATABASE_URL=postgresql://postgres:{password}@pgbouncer:6432/notifier\n"
            "NOTIFIER_DATABASE_POOLER=transaction\n"
            f"NOTIFIER_DATABASE_SESSION_URL=postgresql://postgres:{password}@postgres:5432/notifier\n"
            "PGBOUNCER_HOST_PORT=\n"
        )
    stack.compose("--profile", "pgbouncer", "up", "-d", "--wait", "--wait-timeout", "600")
    probe = (
        "from notifier.settings import get_settings as g; s = g(); "
        "print(s.database_url.split('@')[1], s.transaction_pooled)"
    )
    for service in SERVICES:
        answer = stack.compose("exec", "-T", service, "python", "-c", probe).strip()
        assert answer == "pgbouncer:6432/notifier True", (service, answer)
    before = _pgbouncer_transactions(stack, password)

    rows = 2000
    stack.sql(
        "INSERT INTO notifications (channel, recipient, subject, payload) "
        f"SELECT 'webhook', 'http://webhooks:8080/pooled', 'pooled', json_build_object('n', n) "
        f"FROM generate_series(1, {rows}) AS n"
    )
    counts = "SELECT status, count(*) FROM notifications WHERE subject = 'pooled' GROUP BY 1"
    took = wait_for(
        f"{rows} rows sent through PgBouncer",
        lambda: stack.sql(counts) == f"sent|{rows}",
        timeout=600,
        every=2,
    )
    duplicated, windows = delivered_once_outside_the_windows(stack, "pooled", "/pooled", rows)
    # The workers' statements went through PgBouncer: at least a claim and a record a batch.
    passed = _pgbouncer_transactions(stack, password) - before
    assert passed >= 2 * rows // BATCH_SIZE, passed
    # And none of them met the fault a session-mode driver meets behind a transaction pooler.
    logs = stack.compose("logs", "--no-color", "worker", "beat", timeout=120)
    assert "prepared statement" not in logs
    print(
        f"pgbouncer: {rows} rows sent in {took:.0f} s, {passed} transactions through PgBouncer; "
        f"{len(windows)} retried or rescued, {len(duplicated)} delivered more than once"
    )
