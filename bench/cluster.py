"""A PostgreSQL cluster of a benchmark's own, for the benchmarks that cannot use the machine's.

``Cluster`` runs ``initdb`` with the newest PostgreSQL in ``/usr/lib/postgresql`` (or the one
on ``PATH``) into a new folder under ``$TMPDIR``, and starts the server with the settings it is
given: on loopback and a free port unless told which address and port, optionally inside a
network namespace (a test host of ``bench/testhost.py``). As root, the cluster is made and run
as the ``postgres`` user, as ``initdb`` requires. ``close`` stops the server and removes its
folder, unless the cluster is to be kept.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench.common import SetupError, free_port


def binaries() -> Path:
    """The folder of the newest PostgreSQL's server programs (``initdb``, ``pg_ctl``)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    if initdb is None:
        raise SetupError("no initdb found: install PostgreSQL's server package")
    return Path(initdb).resolve().parent


def as_postgres(folder: Path) -> list[str]:
    """What PostgreSQL's programs run under to work in ``folder``: as root (whom ``initdb``
    refuses), ``folder`` is given to the ``postgres`` user and they run as it; else nothing."""
    if os.geteuid() != 0:
        return []
    user = pwd.getpwnam("postgres")
    os.chown(folder, user.pw_uid, user.pw_gid)
    return ["runuser", "-u", "postgres", "--"]


def run(argv: Sequence[str], *, check: bool = True, name: str | None = None) -> None:
    """Run ``argv`` to its end (five minutes at most). A failure raises a ``SetupError`` with
    the end of what it said, naming it ``name`` or else its first words; not with ``check``
    off."""
    done = subprocess.run(list(argv), capture_output=True, timeout=300, check=False)
    if check and done.returncode:
        said = (done.stderr or done.stdout).decode(errors="replace").strip()[-400:]
        if name is not None:
            raise SetupError(f"{name} failed: {said}")
        raise SetupError(f"{' '.join(argv[:4])} ... failed ({done.returncode}): {said}")


class Cluster:
    """A PostgreSQL cluster of this run's own: ``initdb`` into a new folder (``prefix`` names
    it), the server on ``host`` and ``port`` (a free one unless given) with ``settings``.

    ``inside`` is what the server runs under, e.g. ``ip netns exec NAME`` to run it on a test
    host; ``clients`` are networks besides loopback whose TCP logins it trusts. ``shutdown`` is
    the mode ``close`` stops the server in; with ``keep``, ``close`` leaves the cluster running
    and its folder in place.
    """

    def __init__(
        self,
        settings: Mapping[str, str],
        *,
        prefix: str = "notifier-bench-pg-",
        host: str = "127.0.0.1",
        port: int | None = None,
        inside: Sequence[str] = (),
        clients: Sequence[str] = (),
        shutdown: str = "fast",
        keep: bool = False,
    ) -> None:
        self.bin = binaries()
        self.settings = dict(settings)
        self.host = host
        self.port = free_port() if port is None else port
        self.inside = list(inside)
        self.clients = list(clients)
        self.shutdown = shutdown
        self.keep = keep
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        self.data = self.dir / "data"
        self.as_user = as_postgres(self.dir)

    @property
    def url(self) -> str:
        """The server, without a database name."""
        return f"postgresql://postgres@{self.host}:{self.port}"

    def options(self) -> str:
        """What ``pg_ctl start`` passes to the server: its address, port, socket folder and
        settings."""
        given = " ".join(f"-c {k}={v}" for k, v in self.settings.items())
        return f"-p {self.port} -c listen_addresses={self.host} -k {self.dir} {given}"

    def pg_ctl(self, *args: str) -> list[str]:
        """The command line of ``pg_ctl`` on this cluster with ``args``."""
        return [*self.as_user, str(self.bin / "pg_ctl"), "-D", str(self.data), *args]

    def start(self) -> None:
        """``initdb``, then the server started and ready. On a failure what was made is stopped
        and removed (whether or not it is to be kept) before the error goes on."""
        try:
            run([*self.as_user, str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres",
                 "-A", "trust", "--no-sync"], name="initdb")  # fmt: skip
            with (self.data / "pg_hba.conf").open("a", encoding="utf-8") as hba:
                hba.writelines(f"host all all {net} trust\n" for net in self.clients)
            start = self.pg_ctl("-l", str(self.dir / "log"), "-o", self.options(), "-w", "start")
            run([*self.inside, *start], name="pg_ctl")
        except BaseException:
            self._remove()
            raise

    def close(self) -> None:
        """Stop the server and remove the cluster's folder, unless it is to be kept."""
        if not self.keep:
            self._remove()

    def _remove(self) -> None:
        if (self.data / "postmaster.pid").exists():
            run(self.pg_ctl("-m", self.shutdown, "-w", "stop"), check=False)
        shutil.rmtree(self.dir, ignore_errors=True)
