"""A Postfix of one test's own: Debian's binaries, a private instance on a free loopback port.

The instance has its own configuration directory (``postfix -c DIR``), queue, data directory,
log file and port, all under one temporary directory, so runs side by side never share a
socket, a queue file or a lock; the machine's own Postfix (if any) is never touched. It accepts
mail for ``DOMAIN`` only, offers STARTTLS with a certificate of the test's CA, and delivers each
known mailbox to a Maildir under the temporary directory. It sends nothing anywhere: no DNS, no
local delivery, no relaying (every other destination is the ``error`` transport), and an
unknown mailbox of ``DOMAIN`` is refused at ``RCPT TO`` with ``550 5.1.1``.

Postfix's ``master`` must start as root (it binds the port, then its daemons drop to
``mail_owner``); a test without root, or without the package, is skipped by its fixture.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from tests.certificates import server_certificate

#: The only domain the instance accepts mail for.
DOMAIN = "example.test"
#: Where Debian installs the ``postfix`` command; a test's PATH may not have sbin.
COMMAND = shutil.which("postfix", path="/usr/sbin:/usr/bin:/sbin:/bin")


def missing() -> str | None:
    """Why no private Postfix can run here, or None when one can."""
    if COMMAND is None:
        return "Postfix is not installed (Debian: apt-get install postfix; .ci/run does)"
    if os.geteuid() != 0:
        return "Postfix's master must start as root"
    try:
        pwd.getpwnam("postfix")
        grp.getgrnam("postdrop")
    except KeyError as exc:
        return f"the account Debian's postfix package creates is missing: {exc}"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# service type private unpriv chroot wakeup maxproc command: only what accepting mail over
# SMTP and delivering it to a Maildir takes, nothing chrooted (the queue is the instance's own).
_MASTER_CF = """\
127.0.0.1:{port} inet n - n - - smtpd
cleanup   unix n - n - 0 cleanup
qmgr      unix n - n 300 1 qmgr
tlsmgr    unix - - n 1000? 1 tlsmgr
rewrite   unix - - n - - trivial-rewrite
bounce    unix - - n - 0 bounce
defer     unix - - n - 0 bounce
trace     unix - - n - 0 bounce
verify    unix - - n - 1 verify
flush     unix n - n 1000? 0 flush
proxymap  unix - - n - - proxymap
error     unix - - n - - error
retry     unix - - n - - error
discard   unix - - n - - discard
virtual   unix - n n - - virtual
anvil     unix - - n - 1 anvil
scache    unix - - n - 1 scache
postlog   unix-dgram n - n - 1 postlogd
"""

_MAIN_CF = """\
compatibility_level = 3.6
queue_directory = {dir}/queue
data_directory = {dir}/data
mail_owner = postfix
setgid_group = postdrop
maillog_file = {dir}/maillog
maillog_file_prefixes = {dir}
myhostname = relay.{domain}
mydomain = {domain}
myorigin = $myhostname
mydestination =
inet_interfaces = 127.0.0.1
inet_protocols = ipv4
mynetworks = 127.0.0.0/8
# Mail for {domain}'s listed mailboxes only: relaying is refused even from loopback.
smtpd_relay_restrictions = reject_unauth_destination
smtpd_recipient_restrictions =
smtpd_reject_unlisted_recipient = yes
relay_domains =
alias_maps =
alias_database =
local_recipient_maps =
local_transport = error:5.1.1 no local delivery here
default_transport = error:5.7.1 this test relay sends nothing out
relay_transport = error:5.7.1 this test relay sends nothing out
# No DNS: clients are not looked up, and nothing is sent out anyway.
smtpd_peername_lookup = no
smtp_dns_support_level = disabled
smtp_host_lookup = native
lmtp_host_lookup = native
virtual_mailbox_domains = {domain}
virtual_mailbox_base = {dir}/mail
virtual_mailbox_maps = texthash:{dir}/etc/mailboxes
virtual_alias_maps =
virtual_uid_maps = static:{uid}
virtual_gid_maps = static:{gid}
smtpd_tls_security_level = may
smtpd_tls_cert_file = {cert}
smtpd_tls_key_file = {key}
smtpd_tls_loglevel = 1
smtpd_tls_received_header = yes
smtpd_tls_session_cache_database =
smtpd_banner = $myhostname ESMTP
biff = no
"""


class PostfixServer:
    """``postfix -c DIR start`` in a temporary directory; ``close`` stops it and removes it all.

    ``mailboxes`` are the local parts of ``DOMAIN`` that exist; ``ca`` is the CA file a client
    trusts for the server's certificate (issued for 127.0.0.1).
    """

    def __init__(self, mailboxes: Iterable[str]) -> None:
        reason = missing()
        if reason is not None:
            raise RuntimeError(reason)
        self.port = _free_port()
        self.host = "127.0.0.1"
        self.mailboxes = tuple(mailboxes)
        self.dir = Path(tempfile.mkdtemp(prefix="notifier-test-postfix-"))
        # Postfix's daemons, no longer root, must reach the queue and the mailboxes under it.
        self.dir.chmod(0o755)
        self.etc = self.dir / "etc"
        self.queue = self.dir / "queue"
        self.maildir = self.dir / "mail"
        self.logfile = self.dir / "maillog"
        owner = pwd.getpwnam("postfix")
        for path in (self.etc, self.queue, self.dir / "tls"):
            path.mkdir(mode=0o755)
        for path in (self.dir / "data", self.maildir):
            path.mkdir(mode=0o700)
            os.chown(path, owner.pw_uid, owner.pw_gid)
        tls = server_certificate(self.dir / "tls", self.host)
        self.ca = tls.ca
        self._write_master_cf()
        (self.etc / "main.cf").write_text(
            _MAIN_CF.format(
                dir=self.dir, domain=DOMAIN, uid=owner.pw_uid, gid=owner.pw_gid,
                cert=tls.cert, key=tls.key,
            )
        )  # fmt: skip
        (self.etc / "mailboxes").write_text(
            "".join(f"{box}@{DOMAIN} {box}/\n" for box in self.mailboxes)  # "/": a Maildir
        )

    def _write_master_cf(self) -> None:
        (self.etc / "master.cf").write_text(_MASTER_CF.format(port=self.port))

    # -- life cycle ------------------------------------------------------------------------------

    def _postfix(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(COMMAND), "-c", str(self.etc), *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def start(self, timeout: float = 60.0) -> PostfixServer:
        """Start the instance and wait until its port greets with ``220``."""
        # ``start`` checks the instance first, creating its queue's directories with Postfix's
        # owners and modes (``post-install create-missing``). The free port may be taken by the
        # time master binds it (another run's server): then another port.
        for _ in range(3):
            done = self._postfix("start")
            if done.returncode == 0:
                break
            if f"bind 127.0.0.1 port {self.port}: Address already in use" not in self.log():
                raise RuntimeError(f"postfix start failed: {done.stderr}{self.log()}")
            self.port = _free_port()
            self._write_master_cf()
        else:
            raise RuntimeError(f"Postfix found no free port: {self.log()}")
        deadline = time.monotonic() + timeout
        while not self._greets():
            if time.monotonic() > deadline:
                raise RuntimeError(f"Postfix did not answer on port {self.port}: {self.log()}")
            time.sleep(0.1)
        return self

    def _greets(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=5) as conn:
                return conn.recv(512).startswith(b"220 ")
        except OSError:
            return False

    def processes(self) -> list[int]:
        """PIDs of this instance's processes: every Postfix daemon works in its queue directory."""
        found = []
        for cwd in Path("/proc").glob("[0-9]*/cwd"):
            try:
                if Path(os.readlink(cwd)) == self.queue:
                    found.append(int(cwd.parent.name))
            except OSError:  # exited while we looked
                continue
        return found

    def stop(self, timeout: float = 30.0) -> None:
        """``postfix stop``, then wait until none of the instance's processes is left (what
        still is after ``timeout`` is killed, and the test told)."""
        if not self.processes():
            return
        self._postfix("stop")
        deadline = time.monotonic() + timeout
        while self.processes():
            if time.monotonic() > deadline:
                left = self.processes()
                for pid in left:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                raise RuntimeError(f"Postfix processes {left} outlived postfix stop")
            time.sleep(0.1)

    def close(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- what it did -----------------------------------------------------------------------------

    def log(self) -> str:
        """The instance's log so far (``maillog_file``)."""
        try:
            return self.logfile.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def delivered(self, mailbox: str) -> list[bytes]:
        """Every message delivered to ``mailbox`` so far, as the bytes of its Maildir file
        (Postfix writes a message to ``tmp/`` and renames it into ``new/`` once it is whole)."""
        box = self.maildir / mailbox
        return [
            path.read_bytes()
            for sub in ("new", "cur")
            for path in sorted((box / sub).glob("*"))
            if path.is_file()
        ]

    def queued(self) -> list[Path]:
        """The instance's queue files: mail it accepted but has not delivered (or bounced)."""
        return [
            path
            for sub in ("maildrop", "incoming", "active", "deferred", "hold", "corrupt")
            for path in (self.queue / sub).rglob("*")
            if path.is_file()
        ]
