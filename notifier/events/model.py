"""What a provider's report says, once verified: ``Event``; and why a request is refused."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar

T = TypeVar("T", dict[str, Any], list[Any])


class DeliveryStatus(StrEnum):
    """How a sent message fared. Mirrored by the ``notifications_delivery_status`` CHECK."""

    #: it reached the recipient's mailbox or phone
    delivered = "delivered"
    #: the carrier could not deliver it (SMS)
    undelivered = "undelivered"
    #: the receiving server refused it
    bounced = "bounced"
    #: the recipient reported it as spam
    complained = "complained"


#: The order of states: a report never replaces a later state with an earlier one. A bounce
#: outranks a delivery (a mailbox may accept, then bounce), a complaint outranks everything
#: (it can only follow a delivery). Reports of equal rank: the later timestamp wins.
RANK = {
    DeliveryStatus.delivered: 1,
    DeliveryStatus.undelivered: 2,
    DeliveryStatus.bounced: 2,
    DeliveryStatus.complained: 3,
}


@dataclass(frozen=True, slots=True)
class Event:
    """One verified report about one message (or, for opt-outs, one recipient).

    The row is found by ``notification_id`` (what notifier wrote into the message's headers or
    metadata) or else by ``provider_message_id`` (what the provider answered the send with).
    """

    #: who reported it: ``ses``, ``sendgrid``, ``mailgun``, ``postmark``, ``twilio``
    provider: str
    #: the channel of the row it is about: ``email`` or ``sms``
    channel: str
    #: when the provider says it happened
    at: datetime
    #: the row's new delivery state; ``None`` for a report about the recipient only
    status: DeliveryStatus | None = None
    #: what the provider said, for ``delivery_detail`` and the attempt history
    detail: str = ""
    #: the address or number the report is about, when it names one
    recipient: str | None = None
    notification_id: int | None = None
    provider_message_id: str | None = None
    #: put the recipient on the suppression list, with this reason
    suppress: str | None = None
    #: a soft bounce: counted, and enough of them in a window suppress the recipient
    soft_bounce: bool = False


class Refused(Exception):
    """A request that is not applied: unverified, stale, replayed or malformed.

    ``status`` is the HTTP answer (401 without credentials, 403 with wrong ones, 400 for a
    body that cannot be read); ``reason`` goes to the log and the refusal counter.
    """

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def obj(value: object) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one: providers' optional parts."""
    return value if isinstance(value, dict) else {}


def text_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def row_id(value: object) -> int | None:
    """A notification id as notifier wrote it into a header or metadata, else ``None``."""
    given = str(value).strip() if isinstance(value, str | int) else ""
    return int(given) if given.isdigit() and len(given) <= 18 else None


def parse_json(body: bytes, what: str, kind: type[T]) -> T:
    """The body as JSON of ``kind`` (``dict`` or ``list``), or ``Refused(400)`` naming ``what``."""
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise Refused(400, f"{what} body is not JSON") from None
    if not isinstance(doc, kind):
        raise Refused(400, f"{what} body is not a JSON {'array' if kind is list else 'object'}")
    return doc
