"""A PostgreSQL cluster of one test's own, for the fault tests that restart the server.

Restarting the machine's PostgreSQL would cut off every other test run on the machine (a
developer's beside CI's), so a test that restarts PostgreSQL starts its own cluster with the
machine's binaries (``initdb`` into a temporary directory, a free loopback port) and restarts
that one. As root the cluster runs as the ``postgres`` user, as initdb requires.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def _binaries() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """``initdb`` + ``pg_ctl`` in a temporary directory; ``restart`` is a real server restart."""

    def __init__(self, password: str | None = None) -> None:
        #: with one, TCP logins need it (scram-sha-256); the Unix socket still trusts anyone
        self.password = password
        bin_dir = _binaries()
        if bin_dir is None:
            raise RuntimeError("no initdb found: install PostgreSQL's server package")
        self.bin = bin_dir
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="notifier-test-pg-"))
        self.data = self.dir / "data"
        self._as: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.dir, user.pw_uid, user.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]

    @property
    def url(self) -> str:
        """The server's address for SQLAlchemy, without a database."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}"

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run(
            [*self._as, str(self.bin / tool), *args],
            check=True,
            capture_output=True,
            timeout=120,
        )

    def start(self) -> PostgresServer:
        if not self.data.exists():
            auth = ["-A", "trust"]
            if self.password is not None:
                secret = self.dir / "password"
                secret.write_text(self.password, encoding="utf-8")
                if self._as:
                    user = pwd.getpwnam("postgres")
                    os.chown(secret, user.pw_uid, user.pw_gid)
                auth = ["--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={secret}"]
            self._run("initdb", "-D", str(self.data), "-U", "postgres", *auth, "--no-sync")
        self._pg_ctl("start")
        return self

    def restart(self) -> None:
        self._pg_ctl("restart")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def close(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _pg_ctl(self, action: str) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir}"
            " -c fsync=off -c max_connections=100"
        )
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.dir / "log"), "-o", options, "-w",
            action,
        )  # fmt: skip
