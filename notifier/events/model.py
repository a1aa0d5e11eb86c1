"""What a provider's report says, once verified: ``Event``; and why a request is refused."""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, TypeVar

T = TypeVar("T", dict[str, Any], list[Any])

#: Deepest JSON a provider's document may be: theirs are a handful of levels.
MAX_DEPTH = 32
#: Unix seconds as a signature's timestamp: ASCII digits, nothing else.
_SECONDS = re.compile(r"[0-9]{1,12}")
#: The times a report may name (Python's datetime, and PostgreSQL's, hold them all).
_YEARS = range(1970, 9999)


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


def listed(value: object) -> list[Any]:
    """``value`` if it is a JSON array, else an empty one."""
    return value if isinstance(value, list) else []


def parse_json(body: bytes | str, what: str, kind: type[T]) -> T:
    """The body as JSON of ``kind`` (``dict`` or ``list``), or ``Refused(400)`` naming ``what``:
    not JSON, nested deeper than ``MAX_DEPTH``, or holding a number no JSON writer means
    (``NaN``, ``Infinity``, ``1e999``, an integer of thousands of digits)."""
    try:
        doc = json.loads(body, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise Refused(400, f"{what} body is nested deeper than {MAX_DEPTH} levels") from None
    except ValueError:  # not JSON, not UTF-8, or a number out of range
        raise Refused(400, f"{what} body is not JSON with finite numbers") from None
    if not isinstance(doc, kind):
        raise Refused(400, f"{what} body is not a JSON {'array' if kind is list else 'object'}")
    unfit = _unfit(doc, MAX_DEPTH)
    if unfit:
        raise Refused(400, f"{what} body {unfit}")
    return doc


def unix_time(value: object, what: str) -> datetime:
    """A report's time given as Unix seconds (a JSON number), or ``Refused(400)``."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        try:
            at = datetime.fromtimestamp(value, UTC)
        except (OverflowError, OSError, ValueError):
            pass
        else:
            if at.year in _YEARS:
                return at
    raise Refused(400, f"{what} is not a Unix time in seconds")


def iso_time(value: object, what: str) -> datetime:
    """A report's time given as ISO 8601 (UTC when it names no zone), or ``Refused(400)``."""
    if isinstance(value, str) and len(value) <= 64:
        try:
            at = datetime.fromisoformat(value.replace("Z", "+00:00"))
            at = at.replace(tzinfo=at.tzinfo or UTC).astimezone(UTC)
        except (OverflowError, ValueError):
            pass
        else:
            if at.year in _YEARS:
                return at
    raise Refused(400, f"{what} {str(value)[:40]!r} is not an ISO 8601 time")


def fresh_seconds(value: object, max_age: float, what: str) -> str:
    """A signature's timestamp, Unix seconds as ASCII digits within ``max_age`` of now; else
    ``Refused(403)``. Checked before the signature: a stale request costs no verification."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not _SECONDS.fullmatch(value):
        raise Refused(403, f"{what} timestamp is not Unix seconds")
    if abs(time.time() - int(value)) > max_age:
        raise Refused(403, f"{what} timestamp is stale")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


def _finite(given: str) -> float:
    number = float(given)
    if not math.isfinite(number):
        raise ValueError(f"{given[:20]} is out of range")
    return number


def _unfit(doc: object, limit: int) -> str | None:
    """Why ``doc`` cannot be used: nested deeper than ``limit``, or a string (a key or a
    value) with a lone surrogate, which JSON's ``\\ud800`` can write but nothing can encode."""
    level: list[object] = [doc]
    for depth in range(limit + 1):
        deeper: list[object] = []
        for value in level:
            if isinstance(value, dict | list) and depth == limit:
                return f"is nested deeper than {limit} levels"
            if isinstance(value, dict):
                deeper.extend(value.keys())
                deeper.extend(value.values())
            elif isinstance(value, list):
                deeper.extend(value)
            elif isinstance(value, str) and not _encodable(value):
                return "has a string that is not Unicode text (a lone surrogate)"
        level = deeper
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
