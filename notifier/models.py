"""What a notification is: its statuses, the row a worker holds, an attempt's outcome, and the
limits its fields are held to.

The tables these describe, as the Alembic migrations create them, are ``notifier.db.tables``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any
from uuid import UUID

from notifier.specs import CATEGORY_PATTERN, PROFILE_PATTERN, QuietWindow

#: No channel has a use for a longer recipient: URLs beyond 2048 characters are not reliably
#: accepted, email addresses stop at 254, phone numbers and device tokens are far shorter.
MAX_RECIPIENT_LENGTH = 2048
#: Longest ``subject`` any channel takes (an email header line is at most 998 characters).
MAX_SUBJECT_LENGTH = 2048
#: Longest ``guard``, ``template`` or ``locale`` name.
MAX_NAME_LENGTH = 200
#: Longest ``dedupe_key`` in bytes (UTF-8), the ``notifications_dedupe_key_length`` CHECK: far
#: over any business key, well under what the unique index can hold.
DEDUPE_KEY_BYTES = 1000
#: The CHECK of every ``category`` column, mirroring ``CATEGORY_PATTERN``.
CATEGORY_CHECK = f"category ~ '^{CATEGORY_PATTERN}$'"


def profile_check(column: str) -> str:
    """The CHECK of ``profiles.id`` and ``notifications.profile``, mirroring
    ``PROFILE_PATTERN``."""
    return f"{column} ~ '^{PROFILE_PATTERN}$'"


class Status(StrEnum):
    """Where a notification is in its life. Mirrored by the ``notifications_status`` CHECK."""

    #: waiting for ``next_attempt_at``; the only status the dispatcher claims
    pending = "pending"
    #: claimed by a worker whose lease runs until ``locked_until``
    processing = "processing"
    #: accepted by the provider; final
    sent = "sent"
    #: given up: a permanent failure or attempts used up; ``last_error`` says why; final
    dead = "dead"
    #: withdrawn before it was sent (by its producer or by notifier); final
    cancelled = "cancelled"


#: Which of a profile's addresses a row of each channel goes to (``Profile.address``).
PROFILE_ADDRESSES = {"email": "email", "sms": "phone"}


@dataclass(frozen=True, slots=True)
class Profile:
    """The person a row addresses by its ``profile`` column, as read when the row was claimed
    (``notifier.db.profiles``): what the row's own columns leave unsaid comes from here."""

    id: str
    email: str | None = None
    phone: str | None = None
    push_tokens: tuple[str, ...] = ()
    locale: str | None = None
    #: an IANA name (``Europe/Vienna``), as the producer wrote it: not checked until used
    time_zone: str | None = None
    #: values for templates; a row's payload wins over them
    fields: dict[str, Any] = field(default_factory=dict)
    #: the person's choice for the row's category on its channel; ``None``: never chosen, the
    #: deployment's default for the category holds
    enabled: bool | None = None
    #: the person's own quiet hours (wall-clock start, end in ``time_zone``), if they set them
    quiet: QuietWindow | None = None

    def address(self, channel: str) -> str | None:
        """The profile's address on ``channel``, or ``None`` if it has none there."""
        name = PROFILE_ADDRESSES.get(channel)
        value = getattr(self, name) if name is not None else None
        return value or None


@dataclass(frozen=True, slots=True)
class Notification:
    """A claimed row, as a worker sees it while sending.

    ``attempts`` already counts the attempt under way: the claim adds it.
    """

    id: int
    channel: str
    recipient: str
    subject: str | None
    body: str | None
    payload: dict[str, Any]
    attempts: int
    max_attempts: int
    claim_token: UUID
    created_at: datetime
    dedupe_key: str | None = None
    priority: int = 0
    guard: str | None = None
    expires_at: datetime | None = None
    #: the template to render instead of ``subject`` and ``body`` (``notifier.delivery.prepare``)
    template: str | None = None
    #: the template's locale, e.g. ``de-AT``; ``NOTIFIER_DEFAULT_LOCALE`` when unset
    locale: str | None = None
    #: how often a provider's "slow down" has handed the row back (see ``max_deferrals``)
    deferrals: int = 0
    #: why the row cannot be sent as written, found while reading it (a payload too deep to
    #: parse, a body over the limit): the row goes to ``dead`` with this reason, unsent
    defect: str | None = None
    #: what the message is (``marketing``, ``security``); ``None``: transactional. Opt-outs of
    #: a category stop only its rows (``notifier.delivery.prepare``)
    category: str | None = None
    #: the person the row addresses, read with the claim; ``None`` when it names none
    profile: Profile | None = None

    @property
    def to_devices(self) -> bool:
        """A push row to a person: not sent itself but written out as one row per device
        (``notifier.db.profiles.fan_out``), each sent on its own."""
        return self.channel == "push" and not self.recipient and self.profile is not None


class CampaignStatus(StrEnum):
    """Where a campaign is. Mirrored by the ``campaigns_status`` CHECK."""

    #: created; audience and codes may be imported
    draft = "draft"
    #: its notifications are being written (a launch may be re-run to finish it)
    launching = "launching"
    #: its notifications are being sent
    running = "running"
    #: its pending notifications wait until it is resumed
    paused = "paused"
    #: its unsent notifications were cancelled; final
    cancelled = "cancelled"
    #: fully launched, and every notification sent, dead or cancelled; a launch of new audience
    #: members makes it ``running`` again
    finished = "finished"


class AttemptOutcome(StrEnum):
    """What one attempt came to. Mirrored by the ``notification_attempts_outcome`` CHECK."""

    #: the provider accepted it
    sent = "sent"
    #: a transient failure; tried again later
    retry = "retry"
    #: the provider asked us to slow down; tried again later, attempt not counted
    deferred = "deferred"
    #: given up
    dead = "dead"
    #: not sent: expired, its guard said no, or cancelled meanwhile
    cancelled = "cancelled"
    #: its worker died before recording an outcome; taken back by the rescue
    rescued = "rescued"
    #: reported by the provider after the send: it reached the recipient's mailbox or phone
    delivered = "delivered"
    #: reported by the provider after the send: it could not be delivered (SMS carriers)
    undelivered = "undelivered"
    #: reported by the provider after the send: the receiving server refused it
    bounced = "bounced"
    #: reported by the provider after the send: the recipient marked it as spam
    complained = "complained"
    #: an operator sent a dead row round again (``worker`` names them: ``console:<user>``)
    requeued = "requeued"
    #: held back unsent by its person's quiet hours until they end; attempt not counted
    held = "held"
    #: a push row to a person, written out as one row per device (``parent_id``): ``sent``
    fanned_out = "fanned_out"


#: A recipient to add to ``suppressions``: (channel, recipient, reason, kind).
Suppression = tuple[str, str, str, str]


@dataclass(slots=True)  # not frozen: one is made per row recorded, and frozen costs 3x to make
class Decision:
    """What one claimed row's attempt came to, decided once (``delivery.outcomes.plan``) and
    carried whole: to the statement that moves the row out of ``processing`` and appends its
    attempt to the history, to the suppressions, the metrics and the log."""

    id: int
    channel: str
    #: ``sent``, ``retry``, ``deferred``, ``dead`` or ``cancelled``
    outcome: AttemptOutcome
    #: the reason, for every outcome but ``sent``
    error: str | None = None
    #: when a ``retry`` or ``deferred`` row is due again
    at: datetime | None = None
    message_id: str | None = None
    #: the provider that answered, when one was called
    provider: str | None = None
    #: the Unix time the provider accepted it
    sent_at: float | None = None
    duration_ms: int | None = None
    #: the recipient the provider refused for good, to suppress with the record
    suppress: Suppression | None = None


def truncate(text: str, limit: int = 500) -> str:
    """Keep error texts stored in ``last_error`` readable, bounded and storable: one line,
    at most ``limit`` characters, and every character PostgreSQL cannot store or a terminal
    would act on (NUL, other controls, lone surrogates, bidi overrides) shown as U+FFFD."""
    text = " ".join(text.split())
    if not text.isprintable():
        text = "".join(c if c.isprintable() else "\ufffd" for c in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"
