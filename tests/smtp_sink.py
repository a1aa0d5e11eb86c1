"""A real SMTP server on loopback (aiosmtpd) whose replies a test controls.

``SmtpSink.rcpt_replies`` maps a recipient address to the reply its ``RCPT TO`` gets (e.g.
``"550 5.1.1 no such user"`` or ``"451 4.3.0 try later"``); everyone else gets ``250 OK``.
``data_reply`` replaces the reply to ``DATA``. Every accepted message is kept in ``messages``;
``connections`` counts the connections that got as far as ``RCPT TO``. With ``starttls`` (a
server ``ssl.SSLContext``) the sink offers STARTTLS; with ``implicit_tls`` it speaks TLS from
the first byte.
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any

from aiosmtpd.controller import Controller


@dataclass
class Received:
    mail_from: str
    rcpt_tos: list[str]
    message: EmailMessage

    @property
    def message_id(self) -> str:
        return str(self.message["Message-ID"])


class _Controller(Controller):
    """aiosmtpd's controller, holding its sessions' servers: a session whose STARTTLS handshake
    the client gave up on (a certificate it refused) is left with its transport open by
    aiosmtpd, which the garbage collector would report in some later test; ``stop`` closes it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.servers: list[Any] = []

    def factory(self) -> Any:
        server = super().factory()
        self.servers.append(server)
        return server

    def stop(self, no_assert: bool = False) -> None:
        async def close_left_open() -> None:
            for server in self.servers:
                for transport in (getattr(server, "_original_transport", None), server.transport):
                    if transport is not None and not transport.is_closing():
                        transport.close()
            # A client that refused the server's certificate (implicit TLS) has the server's
            # handshake fail a moment later, and asyncio closes that transport a callback after:
            # let both happen before the loop stops, or its socket outlives the loop.
            await asyncio.sleep(0.2)
            for _ in range(3):  # a closed transport lets its socket go a callback later
                await asyncio.sleep(0)

        if self.loop.is_running():
            asyncio.run_coroutine_threadsafe(close_left_open(), self.loop).result(timeout=10)
        super().stop(no_assert)


@dataclass
class SmtpSink:
    rcpt_replies: dict[str, str] = field(default_factory=dict)
    data_reply: str | None = None
    messages: list[Received] = field(default_factory=list)
    #: every RCPT TO seen, refused or not, with its time.monotonic()
    rcpt_attempts: list[tuple[str, float]] = field(default_factory=list)
    # aiosmtpd makes one session per connection; holding them keeps their identities unique
    sessions: list[Any] = field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = 0
    starttls: ssl.SSLContext | None = None
    implicit_tls: ssl.SSLContext | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _controller: _Controller | None = None

    # aiosmtpd handler hooks -----------------------------------------------------------------

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, rcpt_options: Any
    ) -> str:
        with self._lock:
            self.rcpt_attempts.append((address, time.monotonic()))
            if not any(s is session for s in self.sessions):
                self.sessions.append(session)
        reply = self.rcpt_replies.get(address)
        if reply is not None:
            return reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        if self.data_reply is not None:
            return self.data_reply
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        with self._lock:
            self.messages.append(Received(envelope.mail_from, list(envelope.rcpt_tos), message))
        return "250 Message accepted for delivery"

    # life cycle ------------------------------------------------------------------------------

    def start(self) -> SmtpSink:
        if not self.port:
            with socket.socket() as s:
                s.bind((self.host, 0))
                self.port = s.getsockname()[1]
        self._controller = _Controller(
            self,
            hostname=self.host,
            port=self.port,
            tls_context=self.starttls,
            ssl_context=self.implicit_tls,
        )
        self._controller.start()
        return self

    def stop(self) -> None:
        if self._controller is not None:
            self._controller.stop()
            self._controller = None

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self.sessions)

    def rcpt_addresses(self) -> list[str]:
        with self._lock:
            return [address for address, _ in self.rcpt_attempts]

    def delivered_to(self, address: str) -> list[Received]:
        with self._lock:
            return [m for m in self.messages if address in m.rcpt_tos]
