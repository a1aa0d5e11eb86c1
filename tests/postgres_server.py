"""A PostgreSQL cluster of one test's own, for the fault tests that restart the server.

Restarting the machine's PostgreSQL would cut off every other test run on the machine (a
developer's beside CI's), so a test that restarts PostgreSQL starts its own cluster with the
machine's binaries (``initdb`` into a temporary directory, a free loopback port) and restarts
that one. As root the cluster runs as the ``postgres`` user, as initdb requires.

A failover test adds a streaming standby of such a cluster (``standby``) and promotes it
(``promote``) once the primary is stopped.

A test of several hosts runs one on a test host (``tests.testhosts``): ``inside`` that host,
listening on its ``host`` address, taking logins from the other hosts' ``clients`` networks.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg


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

    def __init__(
        self,
        password: str | None = None,
        *,
        host: str = "127.0.0.1",
        inside: Sequence[str] = (),
        clients: Sequence[str] = (),
    ) -> None:
        #: with one, TCP logins need it (scram-sha-256); the Unix socket still trusts anyone
        self.password = password
        #: the one address it listens on: loopback, or a test host's (``tests.testhosts``)
        self.host = host
        #: what its programs run under, e.g. ``ip netns exec NAME`` to run on a test host
        self.inside = list(inside)
        #: networks besides loopback whose TCP logins it takes, as it takes loopback's
        self.clients = list(clients)
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
        return f"postgresql+psycopg://postgres@{self.host}:{self.port}"

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run(
            [*self.inside, *self._as, str(self.bin / tool), *args],
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
            method = "trust" if self.password is None else "scram-sha-256"
            with (self.data / "pg_hba.conf").open("a", encoding="utf-8") as hba:
                hba.writelines(f"host all all {net} {method}\n" for net in self.clients)
        self._pg_ctl("start")
        return self

    def restart(self) -> None:
        self._pg_ctl("restart")

    def standby(self, name: str = "standby", *, synchronous: bool = False) -> PostgresServer:
        """A streaming standby of this server on a port of its own, started and streaming:
        ``pg_basebackup -R`` (which writes ``standby.signal`` and a ``primary_conninfo``
        naming ``application_name=name``), then ``pg_ctl start``. This server must trust
        its TCP logins (no ``password``).

        ``synchronous``: this server's commits wait until the standby has flushed them
        (``synchronous_standby_names`` names it, set with ``ALTER SYSTEM`` after the base
        backup was taken, so the standby's copy of the configuration does not name a standby
        of its own: promoted, it would wait for ever on every commit). Otherwise commits are
        acknowledged before the standby has them (asynchronous replication)."""
        if self.password is not None:
            raise ValueError("a standby needs a primary that trusts TCP logins")
        replica = PostgresServer()
        conninfo = f"host=127.0.0.1 port={self.port} user=postgres application_name={name}"
        replica._run(
            "pg_basebackup", "-D", str(replica.data), "-d", conninfo, "-R",
            "-X", "stream", "-c", "fast", "--no-sync",
        )  # fmt: skip
        if synchronous:
            self.execute(f"ALTER SYSTEM SET synchronous_standby_names = '\"{name}\"'")
            self.execute("SELECT pg_reload_conf()")
        replica.start()
        want = "sync" if synchronous else "async"
        deadline = time.monotonic() + 60
        while self.execute(
            "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = %s",
            name,
        ) != [("streaming", want)]:
            if time.monotonic() > deadline:
                replica.close()
                raise RuntimeError(f"standby {name} is not streaming ({want}) after 60s")
            time.sleep(0.1)
        return replica

    def promote(self) -> None:
        """Make this standby a primary (``pg_ctl promote``), waiting until it accepts writes."""
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "promote")

    def in_recovery(self) -> bool:
        """``pg_is_in_recovery()``: true on a standby, false on a primary."""
        return bool(self.execute("SELECT pg_is_in_recovery()")[0][0])

    def execute(
        self, sql: str, *params: object, database: str = "postgres"
    ) -> list[tuple[Any, ...]]:
        """``sql`` run in autocommit on this server's ``database``; its rows."""
        with psycopg.connect(
            f"host={self.host} port={self.port} user=postgres dbname={database} connect_timeout=10",
            password=self.password,
            autocommit=True,
        ) as conn:
            cur = conn.execute(sql, params or None)
            return cur.fetchall() if cur.description else []

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
            f"-p {self.port} -c listen_addresses={self.host} -k {self.dir}"
            " -c fsync=off -c max_connections=100"
        )
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.dir / "log"), "-o", options, "-w",
            action,
        )  # fmt: skip
