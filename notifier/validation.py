"""Checks every row gets whatever its channel, before its provider's own ``validate``.

They bound what one producer's row can cost a worker (memory, time, a receiver's patience), and
like ``validate`` they raise ``InvalidNotification`` with a message that says what to fix; the
row goes to ``dead`` after that one attempt. Channel-specific rules (an email address's shape,
a subject's 998 characters, an https URL) stay with the providers.
"""

from __future__ import annotations

import json

from notifier.models import Notification
from notifier.providers.base import InvalidNotification
from notifier.settings import Settings

#: No channel has a use for a longer recipient: URLs beyond 2048 characters are not reliably
#: accepted, email addresses stop at 254, phone numbers and device tokens are far shorter.
MAX_RECIPIENT_LENGTH = 2048


def payload_size(payload: object) -> int:
    """Bytes of ``payload`` as compact UTF-8 JSON: the measure ``max_payload_bytes`` limits.

    Compact, not PostgreSQL's ``jsonb::text`` (which adds spaces), so a producer can compute
    the same number with ``json.dumps(payload, separators=(",", ":"), ensure_ascii=False)``.
    """
    return len(json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode())


def check_common(notification: Notification, settings: Settings) -> None:
    """Raise ``InvalidNotification`` unless the row keeps the limits every channel shares:

    * ``recipient`` is at most ``MAX_RECIPIENT_LENGTH`` (2048) characters;
    * ``payload`` is JSON and at most ``settings.max_payload_bytes`` (``payload_size``).

    That ``payload`` is a JSON object is checked by the dispatcher before this runs.
    """
    recipient = notification.recipient
    if len(recipient) > MAX_RECIPIENT_LENGTH:
        raise InvalidNotification(
            f"recipient is {len(recipient)} characters; at most {MAX_RECIPIENT_LENGTH} allowed"
        )
    try:
        size = payload_size(notification.payload)
    except (TypeError, ValueError) as exc:  # only rows built in code; jsonb is always JSON
        raise InvalidNotification(f"payload is not JSON-serializable: {exc}") from None
    limit = settings.max_payload_bytes
    if size > limit:
        raise InvalidNotification(
            f"payload is {size} bytes as JSON; at most {limit} allowed "
            "(NOTIFIER_MAX_PAYLOAD_BYTES): send a link or an id to the data instead of the data"
        )
