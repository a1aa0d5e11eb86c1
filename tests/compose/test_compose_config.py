"""docker-compose.yml as Compose reads it (``docker compose config``), without starting anything:
valid with and without the ``pgbouncer`` profile, whose PgBouncer is built here (Debian's package,
installed at build time, never at start) and configured for docs/pgbouncer.md's budget.

Needs only the Compose plugin, not a running engine; without ``docker compose`` the tests that
ask it are skipped, saying so.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from notifier.db.pooler import PoolerLimits
from notifier.db.workers import ConnectionLimits
from notifier.worker.budget import Budget, pooled_verdict

ROOT = Path(__file__).resolve().parents[2]
PGBOUNCER = ROOT / "deploy" / "pgbouncer"


def _compose(*args: str) -> subprocess.CompletedProcess[str]:
    """``docker compose`` on this folder's file, configured by ``.env.example`` alone."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFIER_")}
    env["ENV_FILE"] = str(ROOT / ".env.example")
    return subprocess.run(
        ["docker", "compose", "--env-file", str(ROOT / ".env.example"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
        env=env,
    )


def _usable() -> bool:
    return shutil.which("docker") is not None and _compose("version").returncode == 0


needs_compose = pytest.mark.skipif(not _usable(), reason="NO COMPOSE: `docker compose` missing")


def _config(*profiles: str) -> dict[str, Any]:
    chosen = [arg for profile in profiles for arg in ("--profile", profile)]
    quiet = _compose(*chosen, "config", "-q")
    assert quiet.returncode == 0, quiet.stderr
    done = _compose(*chosen, "config", "--format", "json")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


@needs_compose
def test_the_file_is_valid_with_and_without_the_pgbouncer_profile() -> None:
    assert "pgbouncer" not in _config()["services"]
    service = _config("pgbouncer")["services"]["pgbouncer"]
    assert service["profiles"] == ["pgbouncer"]
    assert service["build"]["context"] == str(PGBOUNCER)
    assert service["pull_policy"] == "build"  # built here: no registry has it
    assert service.get("command") is None
    assert service.get("entrypoint") is None
    mounts = {m["target"]: m for m in service["volumes"]}
    ini = mounts["/etc/pgbouncer/pgbouncer.ini"]
    assert ini["source"] == str(PGBOUNCER / "pgbouncer.ini")
    assert ini["read_only"]
    assert service["ports"][0]["host_ip"] == "127.0.0.1"


def test_pgbouncer_is_installed_when_its_image_is_built_never_when_it_starts() -> None:
    dockerfile = (PGBOUNCER / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^FROM python:3\.11-slim$", dockerfile, re.MULTILINE)
    assert re.search(
        r"^RUN apt-get update .*apt-get install [^\n]*pgbouncer", dockerfile, re.S | re.M
    )
    assert re.search(r"^USER postgres$", dockerfile, re.MULTILINE)  # PgBouncer refuses root
    start = (PGBOUNCER / "start").read_text(encoding="utf-8")
    assert not re.search(r"apt|pip|curl|wget", start)
    assert start.rstrip().endswith("exec pgbouncer /etc/pgbouncer/pgbouncer.ini")


def test_the_shipped_pgbouncer_ini_holds_ten_worker_hosts() -> None:
    ini = configparser.ConfigParser(inline_comment_prefixes=(";",))
    ini.read(PGBOUNCER / "pgbouncer.ini", encoding="utf-8")
    settings = ini["pgbouncer"]
    assert settings["pool_mode"] == "transaction"
    assert "postgres" in settings["stats_users"]  # the start-time budget check reads it
    pooler = PoolerLimits(
        database="notifier",
        max_client_conn=settings.getint("max_client_conn"),
        pool_size=settings.getint("default_pool_size"),
        reserve_pool=settings.getint("reserve_pool_size"),
        max_db_connections=0,
        pools=1,
        pool_mode=settings["pool_mode"],
    )
    # Ten hosts of four processes, one more in a rolling restart, on PostgreSQL's defaults.
    postgres = ConnectionLimits(max_connections=100, reserved=3, in_use=0)
    assert pooled_verdict(Budget(concurrency=4, replicas=11), pooler, postgres) is None
