"""The HTTP API's tables (migration 0026), on the one ``metadata`` of ``notifier.db.tables``."""

from __future__ import annotations

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Identity,
    Integer,
    LargeBinary,
    Table,
    Text,
    text,
)

from notifier.db.tables import metadata

_now = text("now()")

api_keys = Table(
    "api_keys",
    metadata,
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    Column("name", Text, nullable=False),
    Column("prefix", Text, nullable=False, unique=True),
    Column("secret_hash", LargeBinary, nullable=False),
    Column("channels", ARRAY(Text)),
    Column("categories", ARRAY(Text)),
    Column("read_only", Boolean, nullable=False, server_default=text("false")),
    Column("per_second", Integer),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=_now),
    Column("revoked_at", DateTime(timezone=True)),
    CheckConstraint("name ~ '^[a-z0-9][a-z0-9_.-]{0,63}$'", name="api_keys_name"),
    CheckConstraint("per_second > 0", name="api_keys_per_second"),
    CheckConstraint("octet_length(secret_hash) = 32", name="api_keys_hash"),
    comment=(
        "Keys of notifier api: made and revoked with notifier api-key; the rows a key writes"
        " carry its name as their producer."
    ),
)

api_requests = Table(
    "api_requests",
    metadata,
    Column("dedupe_key", Text, primary_key=True),
    Column("key_id", BigInteger, nullable=False),
    Column("body_hash", LargeBinary, nullable=False),
    Column("notification_id", BigInteger, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=_now),
    comment=(
        "What each Idempotency-Key was first asked with: the hash of its request, beside the"
        " row's dedupe_key."
    ),
)
