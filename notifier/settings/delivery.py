"""The settings of the delivery itself: where rows and the broker live, how they are claimed and
sent, retried and deferred, rewritten before a send, rate-limited, and kept afterwards."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode

from notifier.settings.parsed import parsed
from notifier.specs import (
    SENTINELS_SYNTAX,
    Address,
    Warmup,
    Window,
    parse_failover,
    parse_limits,
    parse_overrides,
    parse_sentinel_master,
    parse_sentinels,
    parse_warmups,
)


class DeliverySettings(BaseSettings):
    """Fields of ``Settings`` (``model.py``), the one class that reads them."""

    database_url: str = "postgresql://postgres@localhost:5432/notifier"
    """PostgreSQL holding the ``notifications`` table; ``postgresql://`` or
    ``postgresql+psycopg://``."""

    database_pooler: Literal["none", "transaction"] = "none"
    """What ``database_url`` reaches: ``none``, PostgreSQL itself (or a pooler in session
    mode); ``transaction``, a pooler in transaction mode (PgBouncer's ``pool_mode =
    transaction``), which hands each transaction whichever server connection is free. Then
    notifier prepares no statement (psycopg would, after a statement's fifth run, on a server
    connection the next run may not get), and what needs a session of its own (the workers'
    ``LISTEN``, a campaign launch's lock, ``notifier migrate``) uses
    ``database_session_url``, which must then be set. See docs/pgbouncer.md."""

    database_session_url: str | None = Field(None, validate_default=True)
    """PostgreSQL for what must keep one server connection for a while: the workers' wake-up
    ``LISTEN``, a campaign launch's advisory lock, ``notifier migrate``. PostgreSQL directly, or
    a pooler in session mode. Unset: ``database_url``, which is right unless that goes through
    a transaction pooler (``database_pooler``)."""

    redis_url: str = "redis://localhost:6379/0"
    """Redis: the Celery broker, and the home of the rate limits, frequency caps, metrics and
    the dispatcher's wake-up flag. Not read when ``redis_sentinels`` is set."""

    redis_sentinels: Annotated[list[Address], NoDecode, parsed(parse_sentinels)] = Field(
        default_factory=list
    )
    """Redis Sentinels that name the current primary, in place of ``redis_url``:
    ``sentinel-1:26379,sentinel-2:26379,sentinel-3:26379``. Every Redis client of notifier, the
    Celery broker's included, asks them where the primary is and follows it through a failover
    (docs/redis-failover.md). Empty (the default): ``redis_url``."""

    redis_sentinel_master: Annotated[str | None, parsed(parse_sentinel_master)] = None
    """The name the Sentinels monitor the primary under (their ``sentinel monitor NAME ...``);
    needed with ``redis_sentinels``, and only with them."""

    redis_sentinel_password: str | None = None
    """Password of the primary and its replicas (their ``requirepass``), reached through the
    Sentinels; the Sentinels themselves are asked without one."""

    redis_sentinel_db: int = Field(0, ge=0)
    """The database number on the primary, reached through the Sentinels."""

    dispatch_interval: float = Field(30.0, gt=0)
    """Seconds between two beat-fired dispatches: the safety net that finds due rows."""

    wake_on_insert: bool = True
    """Workers LISTEN for inserted rows and dispatch at once (and at a delayed row's time),
    instead of waiting for the next beat."""

    batch_size: int = Field(100, gt=0, le=10_000)
    """Rows one dispatch claims at a time when the queue is quiet: the first claim of every
    dispatch, and every claim after a batch that came back short."""

    max_batch_size: int = Field(1000, gt=0, le=10_000)
    """Largest claim while a backlog remains. A batch whose claim came back full claims more
    each time its rows are all under way and fewer than this many sends run: what it sent in
    half a second at its pace so far (``BATCH_TARGET_SECONDS``), between ``batch_size`` and
    this. Fast rows are claimed a thousand at a time while the last ones are being sent, slow or
    rate-limited ones in small claims, so a transactional row never waits long behind a
    campaign's. Set it to ``batch_size`` for fixed claims."""

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

    override_recipients: Annotated[dict[str, str], NoDecode, parsed(parse_overrides)] = Field(
        default_factory=dict
    )
    """Staging safety: ``email=qa@example.com;sms=+14155550100`` sends every message of those
    channels to that recipient instead of the row's, which stays in the database and reaches
    the provider as ``payload.original_recipient``. Empty (the default) in production."""

    failover: Annotated[dict[str, list[str]], NoDecode, parsed(parse_failover)] = Field(
        default_factory=dict
    )
    """Providers of a channel tried in order when one fails transiently, by provider name:
    ``email=email,email_backup;sms=sms,sms_backup``. A channel not named here is served by
    the provider named like it."""

    rate_limits: Annotated[dict[str, list[Window]], NoDecode, parsed(parse_limits)] = Field(
        default_factory=dict
    )
    """Sends per provider allowed across all workers, e.g. ``email=100/s,20000/h;sms=10/s``
    (windows ``N/s|m|h|d``, ``N/10s``, ``N/s:burst``); see ``notifier/delivery/ratelimit.py``."""

    rate_warmup: Annotated[dict[str, Warmup], NoDecode, parsed(parse_warmups)] = Field(
        default_factory=dict
    )
    """Limits that ramp up by day, for a new sending domain, IP or number whose provider
    trusts it a little more each day: ``email=50/s x2/d to 2000/s from 2026-12-01`` allows 50
    a second on 1 December (UTC), 100 on the 2nd, 200 on the 3rd, ... and 2000 from the 7th on.
    Before the first day the start applies. The first day is written here, never taken from
    when a worker started, so every worker sends at the same day's rate and a restart does not
    begin the ramp again. Applies beside the provider's ``NOTIFIER_RATE_LIMITS`` windows (the
    tightest wins); ``notifier stats`` shows the day and today's rate."""

    retention_sent_days: float = Field(30.0, gt=0)
    """``notifier purge`` and the daily ``notifier.purge`` task delete ``sent`` rows this many
    days after they were sent."""

    retention_dead_days: float = Field(365.0, gt=0)
    """Days a ``dead`` row is kept after it died, for ``notifier requeue`` (its last error is
    on the row; its attempts go with the history's retention)."""

    retention_cancelled_days: float = Field(30.0, gt=0)
    """Days a ``cancelled`` row is kept after it was cancelled."""

    retention_history_days: int = Field(90, ge=7, le=3650)
    """Days the attempt history is kept, whatever its row's own retention: a week of history
    (a partition, Monday to Monday UTC) is dropped whole once all of it is older than this
    (``notifier purge``, daily), so a week is kept up to seven days longer."""

    audience_query_timeout: float = Field(300.0, gt=0)
    """Seconds an audience ``--query`` may run (its ``statement_timeout``) before it is stopped."""

    @property
    def session_database_url(self) -> str:
        """Where what needs a session of its own connects (``database_session_url``)."""
        return self.database_session_url or self.database_url

    @property
    def transaction_pooled(self) -> bool:
        """Whether ``database_url`` goes through a pooler in transaction mode."""
        return self.database_pooler == "transaction"

    @field_validator("database_session_url")
    @classmethod
    def _session_behind_a_pooler(cls, url: str | None, info: ValidationInfo) -> str | None:
        """A transaction pooler needs a session URL beside it: through the pooler a LISTEN
        would hear nothing once its transaction ended, and a launch's lock would stay on a
        server connection other clients get (docs/pgbouncer.md)."""
        if url is None and info.data.get("database_pooler") == "transaction":
            raise ValueError(
                "needed with NOTIFIER_DATABASE_POOLER=transaction: set it to PostgreSQL's own"
                " address (or a session-mode pool) for LISTEN, launches and migrate"
            )
        return url

    @field_validator("redis_sentinel_master")
    @classmethod
    def _master_with_sentinels(cls, name: str | None, info: ValidationInfo) -> str | None:
        """The Sentinels and the master's name go together: one without the other is a switch
        to Sentinel (or away from it) half made, which would leave notifier on a Redis nobody
        meant, or on none."""
        if "redis_sentinels" not in info.data:  # refused already, and named for it
            return name
        if info.data["redis_sentinels"] and name is None:
            raise ValueError(
                "needed with NOTIFIER_REDIS_SENTINELS: set it to the name of the Sentinels'"
                " 'sentinel monitor NAME ...' line, e.g. mymaster"
            )
        if name is not None and not info.data["redis_sentinels"]:
            raise ValueError(
                f"has no Sentinels to ask: set NOTIFIER_REDIS_SENTINELS to {SENTINELS_SYNTAX},"
                " or unset this to use NOTIFIER_REDIS_URL"
            )
        return name
