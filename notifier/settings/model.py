"""``Settings``: every tunable of notifier in one class, parsed once from the environment.

Its fields are declared by theme beside it (``delivery.py``, ``channels.py``, ``people.py``,
``surfaces.py``);
this class joins them under the one ``model_config`` and checks what spans them.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import field_validator
from pydantic_settings import SettingsConfigDict

from notifier.settings.channels import ChannelSettings
from notifier.settings.delivery import DeliverySettings
from notifier.settings.people import PeopleSettings
from notifier.settings.surfaces import SurfaceSettings
from notifier.specs import normalize_locale

#: Where a container gets its secret files (compose ``secrets:``, see docker-compose.yml): a
#: file named like a setting (``notifier_smtp_password``) sets it, unless the environment does.
SECRETS_DIR = Path("/run/secrets")


# Pydantic orders the fields from the last base to the first: delivery, channels, people,
# surfaces (the order of the errors a bad environment gets).
class Settings(SurfaceSettings, PeopleSettings, ChannelSettings, DeliverySettings):
    model_config = SettingsConfigDict(
        env_prefix="NOTIFIER_",
        extra="ignore",
        # Only where it exists: pydantic-settings warns about a missing directory.
        secrets_dir=SECRETS_DIR if SECRETS_DIR.is_dir() else None,
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
        """Accept the plain ``postgresql://`` spelling and run it on psycopg 3. Several hosts
        go in the query, where SQLAlchemy reads them: libpq's ``h1:p1,h2:p2`` in the authority
        would fail later on a port that is not a number."""
        for prefix in ("postgresql://", "postgres://"):
            if url.startswith(prefix):
                url = "postgresql+psycopg://" + url[len(prefix) :]
        if not url.startswith("postgresql+psycopg://"):
            raise ValueError("must be a postgresql:// or postgresql+psycopg:// URL")
        authority = url.removeprefix("postgresql+psycopg://").partition("/")[0]
        if "," in authority.rpartition("@")[2]:  # a password may hold a comma
            raise ValueError(
                "several hosts go in the query: postgresql://USER@/DB"
                "?host=H1:P1&host=H2:P2&target_session_attrs=read-write"
            )
        return url

    @field_validator("database_session_url")
    @classmethod
    def _session_on_psycopg3(cls, url: str | None) -> str | None:
        """The session URL is spelled, and read, like ``database_url``."""
        return None if url is None else cls._use_psycopg3(url)
