"""Every tunable of notifier, read once from the environment (prefix ``NOTIFIER_``).

Each field's docstring says what it does; its default is the value shown. ``get_settings()`` is
the one way the rest of the package reads configuration, so a test can change the environment
and call ``get_settings.cache_clear()``.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Mapping
from enum import StrEnum
from functools import lru_cache
from ipaddress import IPv4Network, IPv6Network
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from notifier.specs import (
    STATUS_EVENTS,
    HostPattern,
    User,
    Window,
    normalize_locale,
    parse_failover,
    parse_hosts,
    parse_limits,
    parse_networks,
    parse_overrides,
    parse_status_events,
    parse_users,
)


class SmtpTls(StrEnum):
    """How the SMTP connection is secured."""

    #: plain SMTP (a local relay or a mail catcher)
    none = "none"
    #: plain connection upgraded with STARTTLS before authenticating
    starttls = "starttls"
    #: TLS from the first byte (SMTPS, usually port 465)
    ssl = "ssl"


def _parsed(parse: Callable[[str], Any]) -> BeforeValidator:
    """Parse the environment's text with ``parse`` (``NoDecode`` keeps it from JSON), whose
    ``ValueError`` names what it expects; a value given already parsed passes on."""
    return BeforeValidator(lambda value: parse(value) if isinstance(value, str) else value)


Networks = Annotated[list[IPv4Network | IPv6Network], NoDecode, _parsed(parse_networks)]


#: Where a container gets its secret files (compose ``secrets:``, see docker-compose.yml): a
#: file named like a setting (``notifier_smtp_password``) sets it, unless the environment does.
SECRETS_DIR = Path("/run/secrets")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="NOTIFIER_",
        extra="ignore",
        # Only where it exists: pydantic-settings warns about a missing directory.
        secrets_dir=SECRETS_DIR if SECRETS_DIR.is_dir() else None,
    )

    database_url: str = "postgresql://postgres@localhost:5432/notifier"
    """PostgreSQL holding the ``notifications`` table; ``postgresql://`` or
    ``postgresql+psycopg://``."""

    redis_url: str = "redis://localhost:6379/0"
    """Redis: the Celery broker, and the home of the dispatcher's wake-up flag."""

    dispatch_interval: float = Field(30.0, gt=0)
    """Seconds between two beat-fired dispatches: the safety net that finds due rows."""

    wake_on_insert: bool = True
    """Workers LISTEN for inserted rows and dispatch at once (and at a delayed row's time),
    instead of waiting for the next beat."""

    batch_size: int = Field(100, gt=0, le=10_000)
    """Rows one dispatch claims at a time when the queue is quiet: the first claim of every
    dispatch, and every claim after a batch that came back short."""

    max_batch_size: int = Field(1000, gt=0, le=10_000)
    """Largest claim while a backlog remains. After a full batch the next claim is what this
    process sent in the last half second (``BATCH_TARGET_SECONDS``), between ``batch_size`` and
    this: fast rows are claimed a thousand at a time, slow or rate-limited ones stay small, so a
    transactional row never waits long behind a campaign's batch. Set it to ``batch_size`` for
    fixed batches."""

    dispatch_budget_seconds: float = Field(20.0, gt=0)
    """How long one dispatch task keeps claiming batches before it hands over to a fresh task."""

    send_concurrency: int = Field(8, gt=0, le=256)
    """Sends of one batch that run at once in a worker process's thread pool: those of providers
    without ``send_async`` (email, SMS, push) and those of rows with a guard."""

    async_send_concurrency: int = Field(100, gt=0, le=10_000)
    """Sends of one batch that run at once on a worker process's event loop: rows without a guard
    whose providers all have ``send_async`` (webhooks). A waiting coroutine costs little, unlike a
    thread, so this is larger; each holds a keep-alive connection to its receiver. More than
    ``batch_size`` never run at once."""

    lease_seconds: int = Field(300, gt=0)
    """How long a claimed row belongs to its worker before the rescue may take it back."""

    heartbeat_seconds: float = Field(5.0, gt=0, le=60)
    """How often each worker process renews its row in ``workers``, from a thread of its own.
    A process silent for three of these is gone, and the rescue takes its rows back without
    waiting for their lease."""

    expected_workers: int = Field(1, gt=0, le=10_000)
    """Worker containers (or machines) running at once, a rolling restart's extra included: a
    worker refuses to start when that many could open more PostgreSQL connections than the
    server allows (see docs/production.md, "Connection budget")."""

    retry_base_seconds: float = Field(30.0, gt=0)
    """Delay before the second attempt; it doubles for every attempt after that."""

    retry_max_seconds: float = Field(3600.0, gt=0)
    """Upper bound of the delay between two attempts."""

    retry_jitter: float = Field(0.2, ge=0, lt=1)
    """Fraction of a delay drawn at random and taken off it, so retries of a burst spread out."""

    smtp_host: str = "localhost"
    """SMTP server for the ``email`` channel."""

    smtp_port: int = Field(25, gt=0, lt=65536)
    """Its port."""

    smtp_username: str | None = None
    """Login, if the server asks for one."""

    smtp_password: str | None = None
    """Password for ``smtp_username``."""

    smtp_tls: SmtpTls = SmtpTls.none
    """``none``, ``starttls`` or ``ssl``."""

    smtp_timeout: float = Field(10.0, gt=0)
    """Seconds allowed for the connection, the TLS handshake and each SMTP reply (the one to
    a message's content included); a whole send is allowed ``longest_send_seconds``."""

    smtp_max_connections: int = Field(45, gt=0, le=1000)
    """SMTP connections a worker process keeps to its relay at most, reused across batches;
    sends past them wait for one to come free. Each carries a message per answer time (20/s
    at 50 ms), so 45 a process is 1,800 emails/s with two processes on 90 connections, under a
    relay that takes 100 from one client, with room for renewals. A relay that refuses more
    (421, a refused connection) shrinks the pool for a while; keep processes times this under
    its limit (Postfix's ``smtpd_client_connection_count_limit``), as refusals cost retries."""

    smtp_messages_per_connection: int = Field(100, gt=0)
    """Messages one SMTP connection carries before it is closed and a new one opened: relays
    limit the messages of a session, and a fresh session goes to a fresh relay behind a load
    balancer."""

    email_from: str = "notifier@localhost"
    """The ``From`` address of every email."""

    webhook_secret: str | None = None
    """Signs webhooks Standard-Webhooks style when set (``whsec_`` + base64, or any string)."""

    webhook_timeout: float = Field(10.0, gt=0)
    """Seconds allowed to connect to a webhook target and for each read; a whole send (connect,
    request, answer) is allowed three times that."""

    webhook_allow_http: bool = False
    """Accept plain ``http://`` webhook targets (local development and tests only)."""

    webhook_allowed_networks: Networks = Field(default_factory=list)
    """Networks a webhook target may resolve to although they are internal (loopback, private,
    link-local, ...), as comma-separated CIDRs: ``10.20.0.0/16,fd00:1::/64``. Empty by default,
    so a producer cannot make notifier call the deployment's own services (SSRF); see
    ``notifier/providers/netguard.py``."""

    status_webhook_url: str | None = None
    """Where notifier POSTs an event each time a row reaches a final status or a delivery state
    (docs/delivery-feedback.md); unset: no events are written at all."""

    status_webhook_secret: str | None = None
    """Signs the status webhook's requests as ``NOTIFIER_WEBHOOK_SECRET`` signs webhooks."""

    status_webhook_events: Annotated[list[str], NoDecode, _parsed(parse_status_events)] = Field(
        default_factory=lambda: list(STATUS_EVENTS)
    )
    """The statuses and delivery states that make an event, comma-separated."""

    status_webhook_max_attempts: int = Field(30, gt=0)
    """POSTs of one event before it is given up as ``dead`` (with the retry backoff, about a
    day); a redirect or another 4xx than 408 and 429 gives it up at once."""

    twilio_account_sid: str | None = None
    """Account SID (``AC...``) of the Twilio account the ``sms`` channel sends through."""

    twilio_auth_token: str | None = None
    """Auth token of that account, the password of every request's HTTP basic auth."""

    twilio_from: str | None = None
    """Sender of every SMS: an E.164 number (``+14155550100``), an alphanumeric sender ID, or a
    Messaging Service SID (``MG`` + 32 hex digits), sent as ``MessagingServiceSid`` so that
    Twilio picks the number."""

    twilio_api_base: str = "https://api.twilio.com"
    """Base URL of Twilio's REST API; https, unless on loopback (tests, a local fake Twilio)."""

    sms_timeout: float = Field(10.0, gt=0)
    """Seconds allowed to connect to Twilio and for each write and read of one send."""

    max_payload_bytes: int = Field(65_536, gt=0)
    """Largest ``payload`` a row may carry, measured as compact UTF-8 JSON; a bigger one makes
    the row ``dead``. Keeps one row from filling a worker's memory or a receiver's limits."""

    max_body_bytes: int = Field(1_048_576, gt=0)
    """Largest ``body`` a row may carry, in UTF-8 bytes; a bigger one makes the row ``dead``
    without being read into the worker (a batch of huge bodies cannot fill its memory)."""

    max_deferrals: int = Field(20, gt=0)
    """How many times a row may be handed back because its receiver or provider asked us to slow
    down (HTTP 429) before it is given up as ``dead``: a receiver that always answers 429 does
    not keep a row waiting for ever."""

    record_attempts: bool = True
    """Keep one ``notification_attempts`` row per attempt (``notifier show`` tells the story)."""

    default_locale: str = Field("en", min_length=1)
    """Locale of the templates a templated row falls back to when it names no locale, or when
    neither its own (``de-AT``) nor its language's (``de``) exists; see
    ``notifier/delivery/prepare.py``."""

    override_recipients: Annotated[dict[str, str], NoDecode, _parsed(parse_overrides)] = Field(
        default_factory=dict
    )
    """Staging safety: ``email=qa@example.com;sms=+14155550100`` sends every message of those
    channels to that recipient instead of the row's, which stays in the database and reaches
    the provider as ``payload.original_recipient``. Empty (the default) in production."""

    failover: Annotated[dict[str, list[str]], NoDecode, _parsed(parse_failover)] = Field(
        default_factory=dict
    )
    """Providers of a channel tried in order when one fails transiently, by provider name:
    ``email=email,email_backup;sms=sms,sms_backup``. A channel not named here is served by
    the provider named like it."""

    rate_limits: Annotated[dict[str, list[Window]], NoDecode, _parsed(parse_limits)] = Field(
        default_factory=dict
    )
    """Sends per provider allowed across all workers, e.g. ``email=100/s,20000/h;sms=10/s``
    (windows ``N/s|m|h|d``, ``N/10s``, ``N/s:burst``); see ``notifier/delivery/ratelimit.py``."""

    fcm_credentials_file: Path | None = None
    """Firebase service-account JSON key the ``push`` channel sends with (FCM HTTP v1); until it
    is set, push rows are retried, never sent."""

    fcm_project_id: str | None = None
    """Firebase project to send through; the key file's ``project_id`` when unset."""

    fcm_api_base: str = "https://fcm.googleapis.com"
    """FCM's API as scheme and host only; ``https://`` (``http://`` only on loopback, for tests)."""

    push_timeout: float = Field(10.0, gt=0)
    """Seconds allowed to connect to FCM or its token endpoint and for each read."""

    guard_http_url: str | None = None
    """Where the built-in ``http`` guard asks whether a row may still be sent."""

    guard_http_timeout: float = Field(5.0, gt=0)
    """Seconds the ``http`` guard waits to connect and for the answer; then the row is retried."""

    metrics_port: int = Field(9808, gt=0, lt=65536)
    """Where ``notifier metrics`` serves ``/metrics`` for Prometheus."""

    log_format: str = Field("text", pattern="^(text|json)$")
    """``text``: plain lines; ``json``: one JSON object per line, with a record's ``extra``
    fields as keys (see ``notifier/logs.py``). Recipients are masked in both."""

    retention_sent_days: float = Field(30.0, gt=0)
    """``notifier purge`` and the daily ``notifier.purge`` task delete ``sent`` rows, and their
    attempt history, this many days after they were sent."""

    retention_dead_days: float = Field(365.0, gt=0)
    """Days a ``dead`` row (and its history) is kept after it died, for ``notifier requeue``."""

    retention_cancelled_days: float = Field(30.0, gt=0)
    """Days a ``cancelled`` row (and its history) is kept after it was cancelled."""

    audience_query_timeout: float = Field(300.0, gt=0)
    """Seconds an audience ``--query`` may run (its ``statement_timeout``) before it is stopped."""

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

    console_users: Annotated[dict[str, User], NoDecode, _parsed(parse_users)] = Field(
        default_factory=dict
    )
    """Who may log in to ``notifier console``: ``name:hash:role`` entries separated by commas,
    role ``admin`` or ``viewer``, hashes from ``notifier console hash-password``. Empty: the
    console refuses to start."""

    console_host: str = "127.0.0.1"
    """The address ``notifier console`` listens on."""

    console_port: int = Field(8090, gt=0, lt=65536)
    """The port ``notifier console`` listens on."""

    console_hosts: Annotated[list[HostPattern], NoDecode, _parsed(parse_hosts)] = Field(
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

    @property
    def longest_send_seconds(self) -> float:
        """The longest one send can take before its provider's timeouts end it.

        SMTP waits up to ``smtp_timeout`` for the connection and for each of about six replies,
        and the email provider bounds a whole send (a pooled connection awaited included) by
        this; HTTP (webhooks, SMS, push) waits for the connection, the request and the response.
        """
        return max(
            6 * self.smtp_timeout,
            3 * self.webhook_timeout,
            3 * self.sms_timeout,
            6 * self.push_timeout,  # a token fetch, then the send
        )

    @property
    def task_soft_time_limit(self) -> float:
        """A dispatch stops starting sends after its budget; this adds one send and a margin."""
        return self.dispatch_budget_seconds + self.longest_send_seconds + 30

    @field_validator("default_locale")
    @classmethod
    def _normalize_locale(cls, value: str) -> str:
        return normalize_locale(value)

    @field_validator("database_url")
    @classmethod
    def _use_psycopg3(cls, url: str) -> str:
        """Accept the plain ``postgresql://`` spelling and run it on psycopg 3."""
        for prefix in ("postgresql://", "postgres://"):
            if url.startswith(prefix):
                return "postgresql+psycopg://" + url[len(prefix) :]
        if not url.startswith("postgresql+psycopg://"):
            raise ValueError("must be a postgresql:// or postgresql+psycopg:// URL")
        return url


PREFIX = "NOTIFIER_"

#: ``NOTIFIER_*`` variables that are not settings yet are read on purpose: the test suite's and
#: the benchmarks' own.
NOT_SETTINGS = ("NOTIFIER_TEST_", "NOTIFIER_BENCH_", "NOTIFIER_FAULT_REPORT")


class SettingsError(ValueError):
    """A setting the environment gives that notifier cannot use, named as the variable."""


def unknown_settings(environ: Mapping[str, str]) -> list[str]:
    """One message per ``NOTIFIER_*`` variable that is no setting, naming the closest one.

    A misspelt variable is otherwise ignored without a word, and the setting it meant keeps its
    default: ``NOTIFIER_OVERRIDE_RECIPIENT`` would leave a staging deployment sending to real
    recipients. Names are compared without regard to case, as they are read.
    """
    known = {field.upper() for field in Settings.model_fields}
    problems = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(PREFIX) or upper.startswith(NOT_SETTINGS):
            continue
        field = upper[len(PREFIX) :]
        if field in known:
            continue
        close = difflib.get_close_matches(field, known, n=1)
        hint = (
            f"did you mean {PREFIX}{close[0]}?"
            if close
            else "the settings are listed in notifier/settings.py"
        )
        problems.append(f"unknown setting {name}; {hint}")
    return problems


def _invalid(exc: ValidationError) -> list[str]:
    """Pydantic's errors, each naming the variable, never the value (it may hold a password)."""
    messages = []
    for error in exc.errors():
        variable = PREFIX + str(error["loc"][0]).upper() if error["loc"] else "a setting"
        message = error["msg"].removeprefix("Value error, ")
        messages.append(f"{variable}: {message}")
    return messages


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read from the environment on first use.

    Raises ``SettingsError``, one line naming every offending variable, when one holds a value
    that is no good or when a ``NOTIFIER_*`` variable is no setting at all.
    """
    problems = unknown_settings(os.environ)
    try:
        settings = Settings()
    except ValidationError as exc:
        problems += _invalid(exc)
    if problems:
        raise SettingsError("; ".join(problems))
    return settings
