"""Every tunable of notifier, read once from the environment (prefix ``NOTIFIER_``).

Each field's docstring says what it does; its default is the value shown. ``get_settings()`` is
the one way the rest of the package reads configuration, so a test can change the environment
and call ``get_settings.cache_clear()``.
"""

from __future__ import annotations

from enum import StrEnum
from functools import lru_cache

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class SmtpTls(StrEnum):
    """How the SMTP connection is secured."""

    #: plain SMTP (a local relay or a mail catcher)
    none = "none"
    #: plain connection upgraded with STARTTLS before authenticating
    starttls = "starttls"
    #: TLS from the first byte (SMTPS, usually port 465)
    ssl = "ssl"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="NOTIFIER_", extra="ignore")

    database_url: str = "postgresql://postgres@localhost:5432/notifier"
    """PostgreSQL holding the ``notifications`` table; ``postgresql://`` or
    ``postgresql+psycopg://``."""

    redis_url: str = "redis://localhost:6379/0"
    """Redis: the Celery broker, and the home of the dispatcher's wake-up flag."""

    dispatch_interval: float = Field(30.0, gt=0)
    """Seconds between two beat-fired dispatches: the safety net that finds due rows."""

    batch_size: int = Field(100, gt=0, le=10_000)
    """Rows one dispatch claims at a time."""

    dispatch_budget_seconds: float = Field(20.0, gt=0)
    """How long one dispatch task keeps claiming batches before it hands over to a fresh task."""

    send_concurrency: int = Field(8, gt=0, le=256)
    """Sends of one batch that run at once in a worker process (a thread pool)."""

    lease_seconds: int = Field(300, gt=0)
    """How long a claimed row belongs to its worker before the rescue may take it back."""

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
    """Seconds allowed for the connection and for each SMTP reply."""

    email_from: str = "notifier@localhost"
    """The ``From`` address of every email."""

    webhook_secret: str | None = None
    """Signs webhooks Standard-Webhooks style when set (``whsec_`` + base64, or any string)."""

    webhook_timeout: float = Field(10.0, gt=0)
    """Seconds allowed to connect to a webhook target and for each read."""

    webhook_allow_http: bool = False
    """Accept plain ``http://`` webhook targets (local development and tests only)."""

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


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read from the environment on first use."""
    return Settings()
