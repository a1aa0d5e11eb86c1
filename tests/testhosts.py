"""Test hosts: several machines' worth of network on this one, for the tests that cut one off.

A test host is a network namespace joined to this machine by a veth pair (``testhost up`` of the
netdelay tools, ``../shared/netdelay`` beside the repository unless ``NOTIFIER_TEST_NETDELAY``
names another folder): ``10.77.N.2`` inside, ``10.77.N.1`` on this side. ``Network`` brings up
several and makes them one network, as machines in one data centre are:

- each host reaches the others' ``10.77.M.0/24`` through its own link, and this machine forwards
  between those links only (``forwarding`` on their interfaces: the machine's ``ip_forward``
  stays as it is, and nothing is forwarded to or from any other interface);
- a blackhole route stands behind each link, so while a host is cut off (``cut``) what is sent
  to it is dropped, as for a machine that vanished, instead of leaving by the default route;
- ``nfqdelay`` holds every packet that crosses a link ``each_way_us`` in each direction (the
  queue of ``testhost delay``, which holds the link's own pair of addresses, also takes what is
  routed through the link), so host to host is two links: 250 us a link is a 1 ms round trip.

Names and indexes are this run's own, so runs side by side never share one: names carry the PID,
indexes are taken, under a lock, from those no address or route of this machine uses (and not
from ``bench/testhost.py``'s 200-249). ``close`` removes everything, after a failure too; the
delays end by themselves after ``seconds`` whatever happens. Needs root, as namespaces do;
``Unavailable`` says why test hosts cannot be had here.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from tests.server_process import stop_server

REPO = Path(__file__).resolve().parents[1]
#: Where the netdelay tools are looked for, in this order.
NETDELAY_FOLDERS = [
    *(Path(p) for p in [os.environ.get("NOTIFIER_TEST_NETDELAY")] if p),
    REPO.parent / "shared" / "netdelay",
    Path("/work/shared/netdelay"),
]
#: Indexes this module takes hosts from (``bench/testhost.py`` uses 200-249).
INDEXES = range(10, 200)
#: Held while a run picks its indexes and brings their links up.
LOCK = Path(tempfile.gettempdir()) / "notifier-testhosts.lock"
#: The blackhole routes' metric: above the link's own route (0), which wins while the link is up.
BLACKHOLE_METRIC = 4077
#: Run inside a host under its own host name: ``$0`` is the name, the command follows.
_RENAMED = 'hostname "$0" && exec "$@"'


class Unavailable(Exception):
    """Test hosts cannot be made on this machine; the message says why."""


@dataclass(frozen=True, slots=True)
class Host:
    """One test host: a network namespace at ``10.77.<index>.2``."""

    role: str
    name: str
    index: int

    @property
    def address(self) -> str:
        return f"10.77.{self.index}.2"

    @property
    def gateway(self) -> str:
        """This machine's end of the host's link: the host's way to the others."""
        return f"10.77.{self.index}.1"

    @property
    def network(self) -> str:
        return f"10.77.{self.index}.0/24"

    @property
    def link(self) -> str:
        """The link's interface on this machine's side: down, the host is cut off."""
        return f"vh-{self.name}"

    @property
    def inside(self) -> tuple[str, ...]:
        """A command prefix that runs a program on this host."""
        return ("ip", "netns", "exec", self.name)

    @property
    def machine(self) -> tuple[str, ...]:
        """``inside``, under the host's own host name (a UTS namespace of its own): what
        ``socket.gethostname()`` says there tells the hosts' processes apart, as it would on
        separate machines."""
        return (*self.inside, "unshare", "--uts", "--", "sh", "-c", _RENAMED, self.name)

    def reaches(self, address: str, port: int, timeout: float = 2.0) -> bool:
        """Whether this host opens a TCP connection to ``address:port`` within ``timeout``."""
        code = (
            "import socket\n"
            f"socket.create_connection(({address!r}, {port}), timeout={timeout}).close()"
        )
        done = subprocess.run(
            [*self.inside, sys.executable, "-c", code], capture_output=True, timeout=timeout + 30
        )
        return done.returncode == 0

    def round_trip_ms(self, address: str, port: int, samples: int = 25) -> float:
        """The median time this host takes to open a TCP connection to ``address:port``: one
        round trip (SYN, SYN-ACK), in milliseconds."""
        code = (
            "import socket, statistics, time\n"
            "took = []\n"
            f"for _ in range({samples}):\n"
            "    started = time.perf_counter()\n"
            f"    socket.create_connection(({address!r}, {port}), timeout=5).close()\n"
            "    took.append(time.perf_counter() - started)\n"
            "print(statistics.median(took) * 1000)\n"
        )
        done = _run([*self.inside, sys.executable, "-c", code])
        return float(done.stdout)


class Network:
    """Test hosts named by ``roles``, one network, ``each_way_us`` a link; ``cut`` and
    ``restore`` a host's link. A context manager; ``start`` raises ``Unavailable``."""

    def __init__(self, roles: Sequence[str], *, each_way_us: int = 250, seconds: int = 900) -> None:
        self.roles = list(roles)
        self.each_way_us = each_way_us
        #: how long the delays last at most, should ``close`` never run
        self.seconds = seconds
        self.hosts: dict[str, Host] = {}
        self._tools = Path()
        self._delays: list[subprocess.Popen[bytes]] = []
        self._blackholes: list[str] = []
        self._accepts: list[list[str]] = []

    def __getitem__(self, role: str) -> Host:
        return self.hosts[role]

    @property
    def networks(self) -> list[str]:
        return [host.network for host in self.hosts.values()]

    def __enter__(self) -> Network:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def start(self) -> Network:
        self._tools = _netdelay()
        try:
            self._up()
            self._route()
            for host in self.hosts.values():
                self._delay(host)
        except BaseException:
            self.close()
            raise
        return self

    def cut(self, host: Host) -> None:
        """Take the host's link down on this machine's side: it reaches nothing, and nothing
        reaches it, until ``restore``."""
        _run(["ip", "link", "set", host.link, "down"])

    def restore(self, host: Host) -> None:
        _run(["ip", "link", "set", host.link, "up"])

    def close(self) -> None:
        """Remove everything ``start`` made, whatever state it is in; processes still running
        on a host (they were started there by this run) are killed first."""
        for delay in self._delays:
            stop_server(delay)
            if delay.stderr is not None:
                delay.stderr.close()
        self._delays.clear()
        for host in self.hosts.values():
            left = _run(["ip", "netns", "pids", host.name], check=False).stdout.split()
            for pid in left:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _run([str(self._tools / "testhost"), "down", host.name], check=False)
        self.hosts.clear()
        for network in self._blackholes:
            _run(["ip", "route", "del", "blackhole", network, "metric", str(BLACKHOLE_METRIC)],
                 check=False)  # fmt: skip
        self._blackholes.clear()
        for rule in self._accepts:
            _run([rule[0], "-D", *rule[2:]], check=False)
        self._accepts.clear()

    def _up(self) -> None:
        stem = _stem(self.roles)
        LOCK.touch(exist_ok=True)
        with LOCK.open() as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            for role, index in zip(self.roles, _free_indexes(len(self.roles)), strict=True):
                host = Host(role, f"{stem}{role}", index)
                self.hosts[role] = host  # before it exists: ``close`` removes what half exists
                _run([str(self._tools / "testhost"), "up", host.name, str(index)])
                _run(["ip", "route", "add", "blackhole", host.network, "metric",
                      str(BLACKHOLE_METRIC)])  # fmt: skip
                self._blackholes.append(host.network)

    def _route(self) -> None:
        hosts = list(self.hosts.values())
        for host in hosts:
            for other in hosts:
                if other is not host:
                    _run([*host.inside, "ip", "route", "add", other.network, "via", host.gateway])
            Path(f"/proc/sys/net/ipv4/conf/{host.link}/forwarding").write_text("1\n")
        # A firewall that forwards nothing it was not told to (as a container engine's does)
        # is told about these links, and only them.
        for tool in _iptables_forwarding_by_rule():
            for a in hosts:
                for b in hosts:
                    if a is not b:
                        rule = [tool, "-I", "FORWARD", "-i", a.link, "-o", b.link, "-j", "ACCEPT"]
                        _run(rule)
                        self._accepts.append(rule)

    def _delay(self, host: Host) -> None:
        if not self.each_way_us:
            return
        queue = str(100 + host.index)  # the queue ``testhost delay`` reads
        device = f"vp-{host.name}"
        routed = [  # what crosses the link to or from another host, beside the link's own pair
            ["PREROUTING", "-i", device, "!", "-s", host.gateway],
            ["OUTPUT", "-o", device, "!", "-d", host.gateway],
        ]
        for match in routed:
            _run([*host.inside, "iptables-legacy", "-t", "mangle", "-A", *match,
                  "-j", "NFQUEUE", "--queue-num", queue, "--queue-bypass"])  # fmt: skip
        delay = subprocess.Popen(
            [str(self._tools / "testhost"), "delay", host.name, str(host.index),
             str(self.each_way_us), str(self.seconds)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        self._delays.append(delay)
        time.sleep(0.3)
        if delay.poll() is not None:
            said = (delay.stderr.read() if delay.stderr else b"").decode(errors="replace")
            raise Unavailable(f"nfqdelay did not start on {host.name}: {said.strip()[-300:]}")


def _netdelay() -> Path:
    """The netdelay tools' folder, with ``nfqdelay`` built (``setup`` is idempotent: it
    builds it, installing what it needs, only the first time)."""
    if os.geteuid() != 0:
        raise Unavailable("test hosts need root: network namespaces and veth pairs")
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            raise Unavailable(f"no {tool} on PATH (iproute2, util-linux)")
    tools = next((p for p in NETDELAY_FOLDERS if (p / "testhost").exists()), None)
    if tools is None:
        raise Unavailable(
            "no netdelay tools (testhost, nfqdelay) in "
            + ", ".join(str(p) for p in NETDELAY_FOLDERS)
            + ": set NOTIFIER_TEST_NETDELAY to their folder"
        )
    try:
        _run([str(tools / "setup")], timeout=240)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        said = str(getattr(exc, "stderr", None) or "").strip()[-300:]
        raise Unavailable(f"{tools / 'setup'} could not build nfqdelay: {said}") from exc
    if shutil.which("iptables-legacy") is None:
        raise Unavailable("no iptables-legacy, which testhost delay needs (Debian's iptables)")
    return tools


def _stem(roles: Sequence[str]) -> str:
    """``n<pid>``, or with a random suffix if a run that died left names like it; a name and
    its ``vh-`` interface must fit the kernel's 15 characters."""
    taken = _run(["ip", "netns", "list"]).stdout + _run(["ip", "-o", "link"]).stdout
    stem = f"n{os.getpid()}"
    while any(f"{stem}{role}" in taken for role in roles):
        stem = f"n{os.getpid()}{secrets.token_hex(1)}"
    longest = max(len(role) for role in roles)
    if len(f"vh-{stem}") + longest > 15:
        raise ValueError(f"roles too long for interface names: {roles}")
    return stem


def _free_indexes(n: int) -> list[int]:
    """``n`` indexes no address or route of this machine names, starting from one the PID
    picks (runs side by side start apart); call under ``LOCK``."""
    seen = _run(["ip", "-o", "-4", "addr", "show"]).stdout + _run(["ip", "route", "show"]).stdout
    used = {int(i) for i in re.findall(r"\b10\.77\.(\d+)\.", seen)}
    first = os.getpid() % len(INDEXES)
    order = [INDEXES[(first + k) % len(INDEXES)] for k in range(len(INDEXES))]
    free = [i for i in order if i not in used][:n]
    if len(free) < n:
        raise Unavailable(f"fewer than {n} free test host indexes in {INDEXES}")
    return free


def _iptables_forwarding_by_rule() -> list[str]:
    """The iptables programs whose FORWARD chain does more than accept everything (a DROP
    policy, or rules a container engine added): ours must be accepted there explicitly."""
    found = []
    for tool in ("iptables", "iptables-legacy"):
        path = shutil.which(tool)
        if path is None:
            continue
        listed = _run([path, "-S", "FORWARD"], check=False)
        if listed.returncode == 0 and listed.stdout.strip() != "-P FORWARD ACCEPT":
            found.append(path)
    return found


def _run(
    argv: list[str], *, check: bool = True, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode:
        raise subprocess.CalledProcessError(done.returncode, argv, done.stdout, done.stderr)
    return done
