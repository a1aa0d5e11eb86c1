"""The settings of what notifier serves and shows beside the delivery: metrics and logs, the
events endpoint (delivery reports, unsubscribes, bounces), the worker's liveness file and the
console."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, NoDecode

from notifier.settings.parsed import Networks, parsed
from notifier.specs import HostPattern, User, parse_hosts, parse_users


class SurfaceSettings(BaseSettings):
    """Fields of ``Settings`` (``model.py``), the one class that reads them."""

    metrics_port: int = Field(9808, gt=0, lt=65536)
    """Where ``notifier metrics`` serves ``/metrics`` for Prometheus."""

    log_format: str = Field("text", pattern="^(text|json)$")
    """``text``: plain lines; ``json``: one JSON object per line, with a record's ``extra``
    fields as keys (see ``notifier/logs.py``). Recipients are masked in both."""

    events_port: int = Field(8025, gt=0, lt=65536)
    """Where ``notifier events`` listens for providers' delivery webhooks and unsubscribes."""

    events_public_url: str | None = None
    """The events endpoint's address as the internet reaches it (``https://events.example.com``):
    the base of one-click unsubscribe links, and the URL Twilio signs its callbacks with. Until
    it is set, emails carry no unsubscribe link and Twilio callbacks are refused."""

    events_max_age_seconds: float = Field(300.0, gt=0)
    """How old a signed timestamp (SendGrid, Mailgun) may be before its request is refused."""

    unsubscribe_secret: str | None = None
    """Seals one-click unsubscribe tokens (ChaCha20-Poly1305 under a key derived from it), and
    reads those signed before (HMAC-SHA256); without it emails carry no link. Changing it
    voids every link already sent."""

    unsubscribe_mailto: str | None = None
    """An address for ``mailto:`` unsubscribes, offered beside the link when set."""

    sns_topic_arns: str = ""
    """Comma-separated SNS topic ARNs whose Amazon SES notifications are accepted; any other
    topic is refused (anyone can make an SNS topic, and AWS signs its messages too)."""

    sns_cert_url_pattern: str = r"^https://sns\.[a-z0-9-]+\.amazonaws\.com(\.cn)?/"
    """A regular expression an SNS ``SigningCertURL`` and ``SubscribeURL`` must match from their
    start through at least the whole host and port: AWS's own SNS hosts. The URL must be plain
    besides (no user, fragment, percent-encoding, dot segment; a certificate's path ends in
    ``.pem``). Tests point it at a loopback server."""

    sendgrid_public_key: str | None = None
    """SendGrid Event Webhook verification key (base64 DER, as SendGrid's settings show it)."""

    mailgun_signing_key: str | None = None
    """Mailgun's HTTP webhook signing key."""

    postmark_webhook_auth: str | None = None
    """``user:password`` that Postmark's webhook URL carries as basic-auth credentials."""

    soft_bounce_limit: int = Field(3, gt=0)
    """Soft bounces of one address within ``soft_bounce_window_hours`` that suppress it."""

    soft_bounce_window_hours: float = Field(168.0, gt=0)
    """The window soft bounces are counted in (a week)."""

    heartbeat_file: Path = Path("/tmp/notifier-worker.heartbeat")  # noqa: S108 - a liveness mark
    """Touched by a worker at every dispatch; ``notifier health --worker`` reads its age."""

    console_users: Annotated[dict[str, User], NoDecode, parsed(parse_users)] = Field(
        default_factory=dict
    )
    """Who may log in to ``notifier console``: ``name:hash:role`` entries separated by commas,
    role ``admin`` or ``viewer``, hashes from ``notifier console hash-password``. Empty: the
    console refuses to start."""

    console_host: str = "127.0.0.1"
    """The address ``notifier console`` listens on."""

    console_port: int = Field(8090, gt=0, lt=65536)
    """The port ``notifier console`` listens on."""

    console_hosts: Annotated[list[HostPattern], NoDecode, parsed(parse_hosts)] = Field(
        default_factory=list
    )
    """The names the console answers for (the ``Host`` header), comma-separated ``host[:port]``
    entries: ``console.example.com``, ``127.0.0.1:8090``, ``[::1]``, ``*.example.com``; without
    a port, any port. Any other host gets 400 before anything else is read, so that a page of
    another site whose name resolves to the console's address (DNS rebinding) reaches nothing.
    Empty: ``127.0.0.1``, ``localhost`` and ``[::1]`` on the port the console listens on. Behind
    a proxy, list the name browsers use (and the ``Host`` the proxy forwards, if it rewrites
    it)."""

    console_scheme: Literal["http", "https"] = "http"
    """How browsers reach the console: ``https`` behind a proxy that terminates TLS (a trusted
    proxy's ``X-Forwarded-Proto`` says it too). A form is accepted only from the origin of this
    scheme, an allowed host and its port; ``Origin: null`` never."""

    console_trusted_proxies: Networks = Field(default_factory=list)
    """Reverse proxies in front of the console (comma-separated addresses or CIDRs) whose
    ``X-Forwarded-For`` and ``X-Forwarded-Proto`` it believes, from those peers only. The client
    (whose failed logins are counted) is then the nearest address in ``X-Forwarded-For`` that
    is not one of them. Empty: no proxy; the client is the peer address, and the headers, which
    anyone can send, are ignored."""

    console_secure_cookie: bool = True
    """Mark the session cookie ``Secure`` (sent over HTTPS only; browsers also send it to
    ``http://localhost``). Turn off only to reach the console over plain HTTP on another name."""

    console_session_minutes: float = Field(480.0, gt=0)
    """How long a console login lasts."""

    console_flower_url: str = ""
    """Where the console's overview links to Flower (none when empty)."""

    api_port: int = Field(8030, gt=0, lt=65536)
    """Where ``notifier api`` listens (behind a TLS-terminating proxy: see ``docs/api.md``)."""

    api_rate_per_second: int = Field(100, gt=0)
    """Requests a second one API key may make, shared by every API process (counted in
    Redis); a key's own ``--per-second`` wins. Past it: 429 with ``Retry-After``."""

    api_pool_size: int = Field(10, gt=0, le=200)
    """Database connections each ``notifier api`` process holds (one per request under way;
    the rest wait): count them in the connection budget, times ``--workers``."""

    api_statement_timeout_seconds: float = Field(10.0, gt=0)
    """How long one of the API's statements may run before PostgreSQL cancels it (the request
    is then answered 503 with ``Retry-After``)."""

    api_max_body_bytes: int = Field(4 * 1024 * 1024, gt=0)
    """The largest request body ``notifier api`` reads; a larger one is refused with 413."""

    api_max_batch: int = Field(1000, gt=0, le=10_000)
    """The most notifications one ``POST /v1/notifications/batch`` may carry."""
