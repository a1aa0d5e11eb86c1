"""A PgBouncer of one test's own, on a free loopback port, in front of a PostgreSQL server.

Debian's ``pgbouncer`` (the package's service stays stopped) runs with an ini file and a user
list written into a temporary directory: every database of the upstream server is served under
its own name (``* = host=... port=...``), so a test's freshly made database is reachable through
it at once, and no name is shared with another run. Logins are trusted, as the upstream's are;
``postgres`` may use the admin console (``admin_users``), where ``show`` asks ``SHOW POOLS``,
``SHOW CLIENTS`` and the like. As root it switches to the ``postgres`` user (``-u``), since
PgBouncer refuses to run as root.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from tests.server_process import free_port, start_server, stop_server


def binary() -> str | None:
    """Where ``pgbouncer`` is installed, if it is."""
    return shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
    )


class PgBouncer:
    """``pgbouncer`` with its own ini; ``url(database)`` reaches a database through it."""

    def __init__(
        self,
        upstream_port: int = 5432,
        *,
        pool_mode: str = "transaction",
        pool_size: int = 4,
        max_client_conn: int = 100,
        upstream_host: str = "127.0.0.1",
    ) -> None:
        found = binary()
        if found is None:
            raise RuntimeError("pgbouncer is not installed (apt-get install pgbouncer)")
        self.binary = found
        self.upstream = (upstream_host, upstream_port)
        self.pool_mode = pool_mode
        self.pool_size = pool_size
        self.max_client_conn = max_client_conn
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="notifier-test-pgbouncer-"))
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, database: str) -> str:
        """``database`` reached through this PgBouncer, for SQLAlchemy."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def _write_config(self) -> Path:
        host, port = self.upstream
        (self.dir / "users.txt").write_text('"postgres" ""\n', encoding="utf-8")
        ini = self.dir / "pgbouncer.ini"
        ini.write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = host={host} port={port}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {self.port}",
                    "unix_socket_dir =",
                    "auth_type = trust",
                    f"auth_file = {self.dir / 'users.txt'}",
                    "admin_users = postgres",
                    f"pool_mode = {self.pool_mode}",
                    f"default_pool_size = {self.pool_size}",
                    "reserve_pool_size = 0",
                    f"max_client_conn = {self.max_client_conn}",
                    f"pidfile = {self.dir / 'pgbouncer.pid'}",
                    "",
                ]
            ),
            encoding="utf-8",
        )
        return ini

    def start(self, timeout: float = 15.0) -> PgBouncer:
        ini = self._write_config()
        args = [self.binary, str(ini)]
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            for path in (self.dir, *self.dir.iterdir()):
                os.chown(path, user.pw_uid, user.pw_gid)
            args = [self.binary, "-u", "postgres", str(ini)]
        self.proc = start_server(
            args, self.log_path, self._answers, what="pgbouncer", timeout=timeout
        )
        return self

    def _answers(self) -> bool:
        try:
            self.show("VERSION")
        except psycopg.OperationalError:
            return False
        return True

    def show(self, what: str) -> list[dict[str, Any]]:
        """``SHOW <what>`` on the admin console (``POOLS``, ``CLIENTS``, ``SERVERS``, ...)."""
        with (
            psycopg.connect(
                f"host=127.0.0.1 port={self.port} user=postgres dbname=pgbouncer connect_timeout=5",
                autocommit=True,
            ) as conn,
            conn.cursor(row_factory=dict_row) as cur,
        ):
            return cur.execute(f"SHOW {what}").fetchall()

    @property
    def log_path(self) -> Path:
        """Where PgBouncer's output goes: it logs to stderr when it runs in the foreground."""
        return self.dir / "pgbouncer.log"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None:
            stop_server(self.proc)
            self.proc = None

    def close(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
