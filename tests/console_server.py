"""Rows in every state, and ``notifier console`` as a real process on a loopback port."""

from __future__ import annotations

import http.cookies
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx
import uvicorn
from sqlalchemy import Engine, text
from starlette.applications import Starlette

from notifier.console.auth import hash_password

#: Cheap hashes for tests (n=2**10); production ones come from ``notifier console hash-password``.
PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret"}
USERS = (
    f"alice:{hash_password(PASSWORDS['alice'], n=2**10)}:admin,"
    f"bob:{hash_password(PASSWORDS['bob'], n=2**10)}:viewer"
)
HOSTILE = '<script>window.__xss=1;alert(1)</script><img src=x onerror="window.__xss=2">'


def seed(engine: Engine) -> dict[str, int]:
    """One row per state (and a hostile one, and a campaign's); their ids by role."""
    ids: dict[str, int] = {}
    rows = {
        # not due for a day: no worker sends it while the test runs
        "pending": "INSERT INTO notifications (channel, recipient, subject, next_attempt_at)"
        " VALUES ('email', 'pending.person@example.com', 'waits', now() + interval '1 day')",
        # claimed by a worker that has no heartbeat row, under a long lease: nobody rescues it
        "processing": "INSERT INTO notifications (channel, recipient, subject, status,"
        " claim_token, claimed_by, locked_until) VALUES ('email', 'busy@example.com', 'busy',"
        " 'processing', gen_random_uuid(), 'elsewhere', now() + interval '1 day')",
        "sent": "INSERT INTO notifications (channel, recipient, subject, status, sent_at,"
        " provider) VALUES ('email', 'sent@example.com', 'done', 'sent', now(), 'email')",
        "dead": "INSERT INTO notifications (channel, recipient, subject, status, attempts,"
        " last_error) VALUES ('null', 'dead.person@example.com', 'gave up', 'dead', 5,"
        " 'gave up after 5 attempts; last error: 503')",
        "cancelled": "INSERT INTO notifications (channel, recipient, status, last_error)"
        " VALUES ('email', 'gone@example.com', 'cancelled', 'user confirmed')",
        "hostile": "INSERT INTO notifications (channel, recipient, subject, body, payload,"
        " status, last_error) VALUES ('email', :hostile, :hostile, :hostile,"
        " jsonb_build_object('html', CAST(:hostile AS text)), 'dead', :hostile)",
    }
    with engine.begin() as conn:
        for name, sql in rows.items():
            ids[name] = conn.execute(text(sql + " RETURNING id"), {"hostile": HOSTILE}).scalar_one()
        ids["campaign"] = conn.execute(
            text(
                "INSERT INTO campaigns (name, channel, subject, status, launched_at)"
                " VALUES ('spring', 'null', 'Spring', 'running', now()) RETURNING id"
            )
        ).scalar_one()
        conn.execute(
            text(
                "INSERT INTO notifications (channel, recipient, subject, campaign_id, priority,"
                " next_attempt_at) SELECT 'null', 'c' || g || '@example.com', 'Spring', :c, -10,"
                " now() + interval '1 day' FROM generate_series(1, 3) g"
            ),
            {"c": ids["campaign"]},
        )
    return ids


def status(engine: Engine, row_id: int) -> str:
    """A row's status, as the console's actions left it."""
    with engine.connect() as conn:
        return str(
            conn.execute(
                text("SELECT status FROM notifications WHERE id = :id"), {"id": row_id}
            ).scalar_one()
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Console:
    """``notifier console`` in a process of its own; its output goes to ``log``."""

    env: Mapping[str, str]
    log: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    _out: IO[bytes] | None = None
    _clients: list[Client] = field(default_factory=list)

    def client(self, local_address: str | None = None) -> Client:
        """A plain HTTP client of this console, closed with it; ``local_address`` (another
        loopback address, 127.0.0.2) makes it another client to the console."""
        self._clients.append(Client(self.url, local_address))
        return self._clients[-1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Console:
        self._out = self.log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "notifier.cli", "console", "--port", str(self.port)],
            env={**self.env, "PYTHONUNBUFFERED": "1"},
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.output()
            try:
                if httpx.get(f"{self.url}/login", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.2)
        raise AssertionError(f"the console did not start:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        for c in self._clients:
            c.http.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)
        if self._out is not None:
            self._out.close()


class Client:
    """Plain HTTP with the cookies a browser would send to ``http://localhost`` (httpx keeps
    ``Secure`` cookies for HTTPS)."""

    def __init__(self, base: str, local_address: str | None = None) -> None:
        self.http = httpx.Client(
            base_url=base,
            follow_redirects=False,
            timeout=30,
            transport=httpx.HTTPTransport(local_address=local_address),
        )
        self.cookies: dict[str, str] = {}
        self.set_cookie: list[str] = []

    def request(
        self,
        method: str,
        path: str,
        data: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        header = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        response = self.http.request(
            method,
            path,
            data=data,
            headers={**({"cookie": header} if header else {}), **(headers or {})},
        )
        for raw in response.headers.get_list("set-cookie"):
            self.set_cookie.append(raw)
            jar = http.cookies.SimpleCookie(raw)
            for name, morsel in jar.items():
                if morsel["max-age"] == "0" or "expires=Thu, 01 Jan 1970" in raw:
                    self.cookies.pop(name, None)
                else:
                    self.cookies[name] = morsel.value
        return response

    def login(self, user: str) -> str:
        """Log in; the session's CSRF token."""
        r = self.try_login(user, PASSWORDS[user])
        assert r.status_code == 303, r.text
        return self.csrf()

    def try_login(self, user: str, password: str) -> httpx.Response:
        """The login form fetched and posted with ``user`` and ``password``; the answer."""
        page = self.request("GET", "/login").text
        token = re.search(r'name="login_token" value="([^"]+)"', page)
        assert token is not None
        return self.request(
            "POST", "/login", {"login_token": token[1], "user": user, "password": password}
        )

    def csrf(self) -> str:
        found = re.search(r'name="csrf" value="([^"]+)"', self.request("GET", "/").text)
        assert found is not None
        return found[1]


def console_env(database_url: str, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k in ("PATH", "HOME", "LANG", "PYTHONPATH", "VIRTUAL_ENV")
    }
    env.update(
        NOTIFIER_DATABASE_URL=database_url,
        NOTIFIER_CONSOLE_USERS=USERS,
        NOTIFIER_CONSOLE_FLOWER_URL="http://127.0.0.1:5555/",
    )
    env.update(extra)
    return env


class Clock:
    """A clock for the console's limits that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@contextmanager
def serving(app: Starlette, port: int) -> Iterator[str]:
    """``app`` served by uvicorn on a loopback ``port`` in a thread of this process (so that a
    test can hand it a ``Clock``); its base URL."""
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_config=None,
        access_log=False,
        lifespan="off",
        proxy_headers=False,  # as notifier console serves it
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive(), "uvicorn stopped"
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)
