"""The tables' expected shape: what the Alembic migrations create, described in SQLAlchemy.

The migrations are the one source of the schema; this description exists so a test can prove the
two agree. The values the CHECKs mirror (statuses, outcomes, limits) are ``notifier.models``.
"""

from __future__ import annotations

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    Time,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import UUID as PgUUID

from notifier.models import CATEGORY_CHECK, DEDUPE_KEY_BYTES, profile_check

metadata = MetaData()

TABLE_COMMENT = (
    'One row per notification to deliver. Producers INSERT rows; see README "Producer contract".'
)

_now = text("now()")

notifications = Table(
    "notifications",
    metadata,
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    Column("channel", Text, nullable=False),
    Column("recipient", Text, nullable=False, server_default=text("''::text")),
    Column("subject", Text),
    Column("body", Text),
    Column("payload", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("dedupe_key", Text, unique=True),
    Column("status", Text, nullable=False, server_default=text("'pending'::text")),
    Column("priority", Integer, nullable=False, server_default=text("0")),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("max_attempts", Integer, nullable=False, server_default=text("5")),
    Column("next_attempt_at", DateTime(timezone=True), nullable=False, server_default=_now),
    Column("last_error", Text),
    Column("provider_message_id", Text),
    Column("provider", Text),
    Column("rescues", Integer, nullable=False, server_default=text("0")),
    Column("deferrals", Integer, nullable=False, server_default=text("0")),
    Column("claim_token", PgUUID(as_uuid=True)),
    Column("claimed_by", Text),
    Column("locked_until", DateTime(timezone=True)),
    Column("guard", Text),
    Column("campaign_id", BigInteger),
    Column("expires_at", DateTime(timezone=True)),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=_now),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=_now),
    Column("sent_at", DateTime(timezone=True)),
    Column("template", Text),
    Column("locale", Text),
    Column("delivery_status", Text),
    Column("delivery_at", DateTime(timezone=True)),
    Column("delivery_detail", Text),
    Column(
        "producer",
        Text,
        comment="Who wrote the row: the login's notifier.producer, or its name; NULL for rows"
        " written before revision 0020.",
    ),
    Column("category", Text),
    Column("profile", Text),
    Column("parent_id", BigInteger),
    Column(
        "request_hash",
        LargeBinary,
        comment="The SHA-256 of the API request that wrote the row, its Idempotency-Key the"
        " dedupe_key; NULL for a row written otherwise.",
    ),
    CheckConstraint(
        "status IN ('pending', 'processing', 'sent', 'dead', 'cancelled')",
        name="notifications_status",
    ),
    CheckConstraint("max_attempts > 0", name="notifications_max_attempts_positive"),
    CheckConstraint("attempts >= 0", name="notifications_attempts_not_negative"),
    CheckConstraint(
        "(status = 'sent') = (sent_at IS NOT NULL)", name="notifications_sent_has_sent_at"
    ),
    CheckConstraint(
        "status <> 'processing' OR (claim_token IS NOT NULL AND locked_until IS NOT NULL)",
        name="notifications_processing_has_lease",
    ),
    CheckConstraint(
        "status <> 'dead' OR last_error IS NOT NULL", name="notifications_dead_has_reason"
    ),
    CheckConstraint(
        "delivery_status IN ('delivered', 'undelivered', 'bounced', 'complained')",
        name="notifications_delivery_status",
    ),
    CheckConstraint(
        "(delivery_status IS NULL) = (delivery_at IS NULL)",
        name="notifications_delivery_has_time",
    ),
    CheckConstraint(
        f"octet_length(dedupe_key) <= {DEDUPE_KEY_BYTES}", name="notifications_dedupe_key_length"
    ),
    CheckConstraint(CATEGORY_CHECK, name="notifications_category"),
    CheckConstraint(profile_check("profile"), name="notifications_profile"),
    Index(
        "notifications_due",
        text("priority DESC"),
        "next_attempt_at",
        "id",
        postgresql_where=text("status = 'pending'"),
    ),
    Index(
        "notifications_campaign_recipient",
        "campaign_id",
        "recipient",
        unique=True,
        postgresql_where=text("campaign_id IS NOT NULL AND profile IS NULL"),
    ),
    Index(
        "notifications_campaign_profile",
        "campaign_id",
        "profile",
        unique=True,
        postgresql_where=text("campaign_id IS NOT NULL AND profile IS NOT NULL"),
    ),
    Index(
        "notifications_parent_recipient",
        "parent_id",
        "recipient",
        unique=True,
        postgresql_where=text("parent_id IS NOT NULL"),
    ),
    Index("notifications_dead", "updated_at", postgresql_where=text("status = 'dead'")),
    Index(
        "notifications_provider_message_id",
        "provider_message_id",
        postgresql_where=text("provider_message_id IS NOT NULL"),
    ),
    Index(
        "notifications_lease",
        "locked_until",
        postgresql_where=text("locked_until IS NOT NULL"),
    ),
    Index("notifications_profile", "profile", "id", postgresql_where=text("profile IS NOT NULL")),
    comment=TABLE_COMMENT,
)


# What the claim reads: an entry for each pending notification, written by triggers on
# ``notifications`` and deleted by the claim that takes it (0029). Found by its row's id when
# the row is cancelled, rescheduled or deleted while pending.
notification_queue = Table(
    "notification_queue",
    metadata,
    Column("id", BigInteger, nullable=False),
    Column("priority", Integer, nullable=False),
    Column("next_attempt_at", DateTime(timezone=True), nullable=False),
    Index("notification_queue_due", text("priority DESC"), "next_attempt_at", "id"),
    Index("notification_queue_id", "id"),
    comment="What the claim reads: an entry for each pending notification, written by triggers"
    " on notifications; see docs/scaling.md.",
)

campaigns = Table(
    "campaigns",
    metadata,
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    Column("name", Text, nullable=False, unique=True),
    Column("channel", Text, nullable=False),
    Column("subject", Text),
    Column("body", Text),
    Column("payload", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("status", Text, nullable=False, server_default=text("'draft'::text")),
    Column("priority", Integer, nullable=False, server_default=text("'-10'::integer")),
    Column("max_attempts", Integer, nullable=False, server_default=text("5")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=_now),
    Column("launched_at", DateTime(timezone=True)),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=_now),
    Column("template", Text),
    Column("locale", Text),
    Column("category", Text, nullable=False, server_default=text("'marketing'::text")),
    Column("audience", Text, nullable=False, server_default=text("'addresses'::text")),
    CheckConstraint(
        "status IN ('draft', 'launching', 'running', 'paused', 'cancelled', 'finished')",
        name="campaigns_status",
    ),
    CheckConstraint("max_attempts > 0", name="campaigns_max_attempts_positive"),
    CheckConstraint(
        "template IS NULL OR (subject IS NULL AND body IS NULL)", name="campaigns_template_or_text"
    ),
    CheckConstraint(
        "locale IS NULL OR template IS NOT NULL", name="campaigns_locale_with_template"
    ),
    CheckConstraint(CATEGORY_CHECK, name="campaigns_category"),
    CheckConstraint("audience IN ('addresses', 'profiles')", name="campaigns_audience"),
)

# Recipient N of a campaign is given code N: positions are dense per campaign, in import order.
campaign_recipients = Table(
    "campaign_recipients",
    metadata,
    Column("campaign_id", BigInteger, nullable=False),
    Column("recipient", Text, nullable=False),
    Column("fields", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("position", BigInteger, nullable=False),
    PrimaryKeyConstraint("campaign_id", "recipient"),
    UniqueConstraint("campaign_id", "position", name="campaign_recipients_position"),
)

campaign_codes = Table(
    "campaign_codes",
    metadata,
    Column("campaign_id", BigInteger, nullable=False),
    Column("code", Text, nullable=False),
    Column("position", BigInteger, nullable=False),
    PrimaryKeyConstraint("campaign_id", "code"),
    UniqueConstraint("campaign_id", "position", name="campaign_codes_position"),
)


# The position ranges launches have written, one row per chunk, committed with the chunk's
# notifications. Kept when ``notifier purge`` deletes the notifications: a launch never writes
# a recorded position again, so a campaign sent and purged is not sent twice.
campaign_chunks = Table(
    "campaign_chunks",
    metadata,
    Column("campaign_id", BigInteger, nullable=False),
    Column("first_position", BigInteger, nullable=False),
    Column("last_position", BigInteger, nullable=False),
    Column("written", BigInteger, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False, server_default=_now),
    PrimaryKeyConstraint("campaign_id", "first_position"),
    CheckConstraint(
        "first_position >= 1 AND last_position >= first_position",
        name="campaign_chunks_range",
    ),
)


notification_attempts = Table(
    "notification_attempts",
    metadata,
    # A sequence, not an identity: PostgreSQL 15 has none on a partitioned table (0027).
    Column(
        "id",
        BigInteger,
        nullable=False,
        server_default=text("nextval('notification_attempts_id_seq'::regclass)"),
    ),
    Column("notification_id", BigInteger, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False, server_default=_now),
    Column("worker", Text, nullable=False),
    Column("channel", Text, nullable=False),
    Column("outcome", Text, nullable=False),
    Column("error", Text),
    Column("duration_ms", Integer),
    Column("provider", Text),
    CheckConstraint(
        "outcome IN ('sent', 'retry', 'deferred', 'dead', 'cancelled', 'rescued', 'requeued',"
        " 'delivered', 'undelivered', 'bounced', 'complained', 'held',"
        " 'fanned_out')",
        name="notification_attempts_outcome",
    ),
    # A row's story, by notification; the table is appended to in time order, so a BRIN index
    # finds a time range at next to no cost per insert (0015). A week to a partition, dropped
    # whole when past its retention (0027: ``history.py``).
    Index("notification_attempts_by_notification", "notification_id", "id"),
    Index(
        "notification_attempts_at",
        "at",
        postgresql_using="brin",
        postgresql_with={"autosummarize": "on"},
    ),
    postgresql_partition_by="RANGE (at)",
)

templates = Table(
    "templates",
    metadata,
    Column("name", Text, nullable=False),
    Column("channel", Text, nullable=False),
    Column("locale", Text, nullable=False),
    Column("subject", Text),
    Column("body", Text),
    Column("html", Text),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=_now),
    PrimaryKeyConstraint("name", "channel", "locale"),
    CheckConstraint(
        "subject IS NOT NULL OR body IS NOT NULL OR html IS NOT NULL",
        name="templates_has_content",
    ),
    comment=(
        "Jinja2 templates a notification names in its template column;"
        " written by notifier template add."
    ),
)

suppressions = Table(
    "suppressions",
    metadata,
    Column("channel", Text, nullable=False),
    Column("recipient", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=_now),
    Column("kind", Text, nullable=False, server_default=text("'opt-out'::text")),
    PrimaryKeyConstraint("channel", "recipient"),
    CheckConstraint(
        "kind IN ('opt-out', 'bounce', 'complaint', 'invalid', 'operator')",
        name="suppressions_kind",
    ),
    comment=(
        "Recipients never sent to on a channel. Producers may INSERT ... ON CONFLICT DO NOTHING;"
        " notifier adds hard bounces."
    ),
)

# Opt-outs of one category (migration 0021); stored by the suppressions' recipient rule.
category_opt_outs = Table(
    "category_opt_outs",
    metadata,
    Column("channel", Text, nullable=False),
    Column("recipient", Text, nullable=False),
    Column("category", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=_now),
    PrimaryKeyConstraint("channel", "recipient", "category"),
    CheckConstraint(CATEGORY_CHECK, name="category_opt_outs_category"),
    comment=(
        "Recipients not sent rows of one category on a channel (one-click unsubscribes)."
        " Producers may INSERT ... ON CONFLICT DO NOTHING."
    ),
)

# People a notification may address by the producer's id for them (migration 0022).
profiles = Table(
    "profiles",
    metadata,
    Column("id", Text, primary_key=True),
    Column("email", Text),
    Column("phone", Text),
    Column("push_tokens", ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")),
    Column("locale", Text),
    Column("time_zone", Text),
    Column("fields", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=_now),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=_now),
    Column("quiet_start", Time),
    Column("quiet_end", Time),
    CheckConstraint(profile_check("id"), name="profiles_id"),
    CheckConstraint(
        "(quiet_start IS NULL) = (quiet_end IS NULL) AND quiet_start <> quiet_end",
        name="profiles_quiet_hours",
    ),
    comment=(
        "The people notifications may address by the producer's id for them; producers upsert"
        " them (INSERT ... ON CONFLICT (id) DO UPDATE)."
    ),
)

_SOURCES = "source IN ('person', 'operator', 'producer')"

preferences = Table(
    "preferences",
    metadata,
    Column("profile", Text, nullable=False),
    Column("category", Text, nullable=False),
    Column("channel", Text, nullable=False),
    Column("enabled", Boolean, nullable=False),
    Column("source", Text, nullable=False, server_default=text("'producer'::text")),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=_now),
    PrimaryKeyConstraint("profile", "category", "channel"),
    CheckConstraint(CATEGORY_CHECK, name="preferences_category"),
    CheckConstraint(_SOURCES, name="preferences_source"),
    comment=(
        "What a person chose per category and channel; no row: the deployment's default for"
        " the category."
    ),
)

preference_history = Table(
    "preference_history",
    metadata,
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    Column("profile", Text, nullable=False),
    Column("category", Text, nullable=False),
    Column("channel", Text, nullable=False),
    Column("enabled", Boolean, nullable=False),
    Column("source", Text, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False, server_default=_now),
    CheckConstraint(_SOURCES, name="preference_history_source"),
    Index("preference_history_profile", "profile", "id"),
    comment=(
        "Every change of a preference: when, to what, and who made it; written by a trigger on"
        " preferences."
    ),
)

workers = Table(
    "workers",
    metadata,
    Column("name", Text, primary_key=True),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=_now),
    Column("last_seen", DateTime(timezone=True), nullable=False, server_default=_now),
    Column("alive_until", DateTime(timezone=True), nullable=False),
    CheckConstraint("alive_until >= last_seen", name="workers_alive_after_seen"),
    comment=(
        "One row per worker process that claims notifications, renewed by its heartbeat;"
        " read by the rescue and notifier health."
    ),
)

status_webhook = Table(
    "status_webhook",
    metadata,
    Column("only_row", Boolean, primary_key=True, server_default=text("true")),
    Column("events", ARRAY(Text), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=_now),
    CheckConstraint("only_row", name="status_webhook_one_row"),
    comment=(
        "The events the status webhook sends, as workers last configured it;"
        " no row: none, and no trigger."
    ),
)

status_events = Table(
    "status_events",
    metadata,
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    Column("notification_id", BigInteger, nullable=False),
    Column("kind", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("channel", Text, nullable=False),
    Column("dedupe_key", Text),
    Column("detail", Text),
    Column("occurred_at", DateTime(timezone=True), nullable=False),
    Column("status", Text, nullable=False, server_default=text("'pending'::text")),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("next_attempt_at", DateTime(timezone=True), nullable=False, server_default=_now),
    Column("claim_token", PgUUID(as_uuid=True)),
    Column("locked_until", DateTime(timezone=True)),
    Column("last_error", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=_now),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=_now),
    CheckConstraint("kind IN ('status', 'delivery')", name="status_events_kind"),
    CheckConstraint(
        "status IN ('pending', 'processing', 'sent', 'dead')", name="status_events_status"
    ),
    CheckConstraint(
        "status <> 'processing' OR (claim_token IS NOT NULL AND locked_until IS NOT NULL)",
        name="status_events_processing_has_claim",
    ),
    CheckConstraint(
        "status <> 'dead' OR last_error IS NOT NULL", name="status_events_dead_has_error"
    ),
    Index(
        "status_events_due", "next_attempt_at", "id", postgresql_where=text("status = 'pending'")
    ),
    Index(
        "status_events_processing", "locked_until", postgresql_where=text("status = 'processing'")
    ),
    Index("status_events_dead", "updated_at", postgresql_where=text("status = 'dead'")),
    comment=(
        "The status webhook's outbox: one row per notification that reached a final or delivery"
        " state, POSTed to NOTIFIER_STATUS_WEBHOOK_URL."
    ),
)

# The HTTP API's tables join the same metadata (kept in a module of their own).
from notifier.db import api_tables  # noqa: E402, F401
