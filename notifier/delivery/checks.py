"""Checks every row gets whatever its channel, before its provider's own ``validate``.

They bound what one producer's row can cost a worker (memory, time, a receiver's patience), and
like ``validate`` they raise ``InvalidNotification`` with a message that says what to fix; the
row goes to ``dead`` after that one attempt. Channel-specific rules (an email address's shape,
a subject's 998 characters, an https URL) stay with the providers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from notifier.delivery.outcomes import Cancelled, Result
from notifier.models import (
    MAX_NAME_LENGTH,
    MAX_RECIPIENT_LENGTH,
    MAX_SUBJECT_LENGTH,
    Notification,
    truncate,
)
from notifier.providers.base import InvalidNotification, Permanent, Provider
from notifier.settings import Settings

log = logging.getLogger(__name__)

#: Deepest nesting of a payload's objects and arrays: templates and receivers read a few levels,
#: and every JSON library has a recursion limit of its own.
MAX_PAYLOAD_DEPTH = 64


def payload_size(payload: object) -> int:
    """Bytes of ``payload`` as compact UTF-8 JSON: the measure ``max_payload_bytes`` limits.

    Compact, not PostgreSQL's ``jsonb::text`` (which adds spaces), so a producer can compute
    the same number with ``json.dumps(payload, separators=(",", ":"), ensure_ascii=False)``.
    """
    return len(json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode())


def check_common(notification: Notification, settings: Settings) -> None:
    """Raise ``InvalidNotification`` unless the row keeps the limits every channel shares:

    * ``recipient`` is at most ``MAX_RECIPIENT_LENGTH`` (2048) characters, ``subject`` at most
      ``MAX_SUBJECT_LENGTH`` (2048), ``guard``, ``template`` and ``locale`` at most
      ``MAX_NAME_LENGTH`` (200); a claim reads one character past each limit, no more;
    * ``payload`` is JSON, at most ``settings.max_payload_bytes`` (``payload_size``) and nested
      at most ``MAX_PAYLOAD_DEPTH`` (64) levels deep;
    * ``body`` is at most ``settings.max_body_bytes`` (checked by the claim, which does not read
      a longer one: see ``Notification.defect``).

    That ``payload`` is a JSON object is checked by the dispatcher before this runs.
    """
    for field, value, limit in (
        ("recipient", notification.recipient, MAX_RECIPIENT_LENGTH),
        ("subject", notification.subject, MAX_SUBJECT_LENGTH),
        ("guard", notification.guard, MAX_NAME_LENGTH),
        ("template", notification.template, MAX_NAME_LENGTH),
        ("locale", notification.locale, MAX_NAME_LENGTH),
    ):
        if value is not None and len(value) > limit:
            raise InvalidNotification(f"{field} is longer than {limit} characters")
    if notification.payload != {}:  # the column's default, and most rows': nothing to measure
        _check_payload(notification.payload, settings.max_payload_bytes)
    body = notification.body
    if body is not None and len(body) * 4 > settings.max_body_bytes:  # cheap unless near
        size = len(body.encode(errors="surrogatepass"))
        if size > settings.max_body_bytes:
            raise InvalidNotification(
                f"body is {size} bytes; at most {settings.max_body_bytes} allowed "
                "(NOTIFIER_MAX_BODY_BYTES): send a link to the content instead"
            )


def _check_payload(payload: object, limit: int) -> None:
    depth = payload_depth(payload)
    if depth > MAX_PAYLOAD_DEPTH:
        raise InvalidNotification(
            f"payload is nested {depth} levels deep; at most {MAX_PAYLOAD_DEPTH} allowed"
        )
    try:
        size = payload_size(payload)
    except (TypeError, ValueError) as exc:  # only rows built in code; jsonb is always JSON
        raise InvalidNotification(f"payload is not JSON-serializable: {exc}") from None
    if size > limit:
        raise InvalidNotification(
            f"payload is {size} bytes as JSON; at most {limit} allowed "
            "(NOTIFIER_MAX_PAYLOAD_BYTES): send a link or an id to the data instead of the data"
        )


def payload_depth(value: object) -> int:
    """Levels of objects and arrays in ``value`` (a scalar is 0), without recursion, stopping
    one level past ``MAX_PAYLOAD_DEPTH``."""
    depth = 0
    level: list[object] = [value]
    while depth <= MAX_PAYLOAD_DEPTH:
        containers = [i for i in level if isinstance(i, dict | list)]
        if not containers:
            break
        depth += 1
        level = [child for c in containers for child in (c.values() if isinstance(c, dict) else c)]
    return depth


class RowCheck:
    """Why a claimed row cannot be sent now, found without any network call; ``None`` if it
    can: a defect found while reading it, an unknown channel, a payload that is not a JSON
    object, the limits every row has (``check_common``), its provider's ``validate``, expiry."""

    def __init__(
        self,
        chains: Mapping[str, Sequence[Provider]],
        settings: Settings,
        clock: Callable[[], datetime],
    ) -> None:
        self._chains = chains
        self.settings = settings
        self.clock = clock

    def __call__(self, n: Notification) -> Result | None:
        """Why the row cannot be sent now, found without any network call; None if it can.

        Whatever the row holds, this answers: an exception a check did not expect is the row's
        own ``Permanent`` outcome (naming the exception), never its batch's."""
        try:
            return self._checked(n)
        except Exception as exc:
            log.exception("checking notification %d raised", n.id)
            return Permanent(f"invalid notification: checking it raised {named(exc)}")

    def _checked(self, n: Notification) -> Result | None:
        reason = row_problem(n, self._chains, self.settings)
        if reason is not None:
            return Permanent(reason)
        if n.expires_at is not None and self.clock() >= n.expires_at:
            return Cancelled("expired")
        return None


def row_problem(
    n: Notification, chains: Mapping[str, Sequence[Provider]], settings: Settings
) -> str | None:
    """Why the row can never be sent as written, as its ``last_error`` says it; ``None`` if it
    may be: a defect found while reading it, an unknown channel, a payload that is not a JSON
    object, the limits every row has (``check_common``), its provider's ``validate``. The
    worker's check (``RowCheck``) and the one at the door (``notifier.delivery.intake``)."""
    if n.defect is not None:
        return f"invalid notification: {n.defect}"
    chain = chains.get(n.channel)
    if not chain:
        return unknown_channel(n.channel, chains)
    try:
        if not isinstance(n.payload, dict):
            raise InvalidNotification(
                f"payload must be a JSON object, not {type(n.payload).__name__}"
            )
        check_common(n, settings)
        if not n.to_devices:  # each device's row is validated when it is sent
            chain[0].validate(n)
    except InvalidNotification as exc:
        return f"invalid notification: {exc}"
    return None


def unknown_channel(channel: str, chains: Mapping[str, Sequence[Provider]]) -> str:
    known = ", ".join(sorted(chains)) or "none"
    return f"unknown channel {channel!r}; this deployment serves: {known}"


def recipient_problem(recipient: str, provider: Provider) -> str | None:
    """Why no row to ``recipient`` can be sent through ``provider``, in the words of the row
    check (without its ``invalid notification:``); ``None`` if one may be. The same checks
    as ``row_problem``'s of the recipient: its length, then ``Provider.validate_recipient``."""
    try:
        if len(recipient) > MAX_RECIPIENT_LENGTH:
            raise InvalidNotification(f"recipient is longer than {MAX_RECIPIENT_LENGTH} characters")
        provider.validate_recipient(recipient)
    except InvalidNotification as exc:
        return str(exc)
    return None


def named(exc: BaseException) -> str:
    """An exception as a row's reason: its class and message, on one bounded line."""
    return truncate(f"{type(exc).__name__}: {exc}", 300)
