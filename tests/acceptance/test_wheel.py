"""The wheel alone runs notifier: built from the repository, installed with the locked
dependencies into a fresh venv, and run from an empty directory, with nothing else of the
repository at hand. This is what the image does."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, text

from tests.acceptance.conftest import REPO, Services, wait_for
from tests.conftest import POSTGRES

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

#: What the Dockerfile's first stage copies to build the wheel.
SOURCES = ("pyproject.toml", "README.md", "celeryconfig.py", "alembic", "notifier")


def _run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``bin`` directory of a fresh venv holding the lock and notifier's wheel, nothing more."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    source.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__")
            shutil.copytree(REPO / name, source / name, ignore=ignore)
        else:
            shutil.copy2(REPO / name, source / name)
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", root / "dist", source, cwd=root)
    (wheel,) = (root / "dist").glob("notifier-*.whl")

    venv = root / "venv"
    _run(sys.executable, "-m", "venv", venv, cwd=root)
    pip = (venv / "bin" / "python", "-m", "pip", "--disable-pip-version-check")
    _run(*pip, "install", "--quiet", "--require-hashes", "-r", REPO / "requirements.lock", cwd=root)
    _run(*pip, "install", "--quiet", "--no-deps", wheel, cwd=root)
    _run(*pip, "check", cwd=root)
    return venv / "bin"


@pytest.fixture
def database() -> Iterator[str]:
    """The URL of a database that does not exist yet; dropped after the test."""
    name = f"notifier_wheel_{uuid.uuid4().hex[:12]}"
    yield f"{POSTGRES}/{name}"
    admin = create_engine(f"{POSTGRES}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
    admin.dispose()


def test_the_installed_wheel_migrates_and_delivers(
    installed: Path, database: str, redis_url: str, tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {
        "PATH": f"{installed}{os.pathsep}{os.environ['PATH']}",
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "VIRTUAL_ENV": str(installed.parent),
        "PYTHONUNBUFFERED": "1",
        "NOTIFIER_DATABASE_URL": database,
        "NOTIFIER_REDIS_URL": redis_url,
        "NOTIFIER_DISPATCH_INTERVAL": "1",
        "NOTIFIER_HEARTBEAT_FILE": str(tmp_path / "heartbeat"),
    }
    where = _run(
        installed / "python", "-c", "import notifier; print(notifier.__file__)", cwd=empty, env=env
    )
    assert Path(where.strip()).is_relative_to(installed.parent), "not the installed copy"
    assert _run(installed / "notifier", "--version", cwd=empty, env=env) == (
        f"notifier {metadata.version('notifier')}\n"
    )

    assert "created database" in _run(installed / "notifier", "migrate", cwd=empty, env=env)
    engine = create_engine(database)
    try:
        with engine.connect() as conn:
            revision = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
        assert revision == ScriptDirectory(str(REPO / "alembic")).get_current_head()

        services = Services(env, tmp_path, celery=(str(installed / "celery"),), cwd=empty)
        try:
            services.worker()
            services.beat()
            with engine.begin() as conn:
                conn.execute(
                    text("INSERT INTO notifications (channel, recipient) VALUES ('null', 'x')")
                )

            def sent() -> bool:
                with engine.connect() as conn:
                    status = conn.execute(text("SELECT status FROM notifications")).scalar()
                return status == "sent"

            wait_for(sent, 60, "the row to be sent by the installed worker")
        except AssertionError:
            print(services.output())
            raise
        finally:
            services.stop()
    finally:
        engine.dispose()
