"""The worker's row checks at the door: a row refused before it is written, with the reason its
worker would have recorded in ``last_error`` after claiming it.

``Intake.refusal`` runs, on a would-be row, what a worker runs on a claimed one before any
network call, in the same order and through the same functions: the template and locale
(``prepare.template_of`` and ``prepare.apply``, when the caller can read the templates), then
the row check (``checks.row_problem``: channel, payload, the limits every row has, the
provider's ``validate``), then the guard's name. It adds what only a write can get wrong: text
PostgreSQL cannot store (a NUL character, a lone surrogate) and a dedupe key longer than the
``notifications_dedupe_key_length`` CHECK allows.

What needs the network stays at send time: a webhook host's addresses (looked up and checked
by the SSRF guard, ``netguard``, right before each POST), an email domain's mail servers, what
the guard answers. A recipient on the suppression list is not refused: its row is cancelled.

``Intake.recipient_check`` checks recipients alone, for a campaign's audience.
"""

from __future__ import annotations

import functools
import operator
import re
import threading
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from notifier.db.templates import TemplateRow
from notifier.delivery import guards as guards_module
from notifier.delivery.checks import recipient_problem, row_problem, unknown_channel
from notifier.delivery.prepare import apply, template_of
from notifier.models import DEDUPE_KEY_BYTES, Notification, Profile, truncate
from notifier.providers import Registry, chains, load_registry
from notifier.settings import Settings

#: A JSON text's escaped NUL (``\u0000``), which jsonb refuses; not an escaped backslash.
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")

#: Reads every stored locale of the template (name, channel).
TemplateReader = Callable[[str, str], Iterable[TemplateRow]]

_TEXT_FIELDS = (
    "channel",
    "recipient",
    "subject",
    "body",
    "dedupe_key",
    "guard",
    "template",
    "locale",
    "category",
)
#: A row's text fields, read in one call (a check of every row written).
_TEXTS_OF = operator.attrgetter(*_TEXT_FIELDS)


class Intake:
    """The checks of this deployment's providers and guards, loaded once."""

    def __init__(
        self,
        settings: Settings,
        registry: Registry | None = None,
        guards: guards_module.Registry | None = None,
    ) -> None:
        self.settings = settings
        self.registry = load_registry(settings) if registry is None else registry
        self.guards = guards_module.load_registry(settings) if guards is None else guards
        self.chains = chains(self.registry, settings.failover)

    def refusal(self, n: Notification, templates: TemplateReader | None = None) -> str | None:
        """Why the would-be row ``n`` cannot be written, as one line: the ``last_error`` a
        worker would record for it (``truncate``d like it), or what the write itself would
        refuse; ``None`` if it may be written. ``templates`` reads the row's template; without
        it, a templated row's message is not checked (it is rendered from the template)."""
        reason = _unstorable(n) or self._problem(n, templates)
        return None if reason is None else truncate(reason)

    def _problem(self, n: Notification, templates: TemplateReader | None) -> str | None:
        if n.template is not None and isinstance(n.payload, dict):
            if templates is None:
                return self._unrendered_problem(n)
            found = template_of(n, templates(n.template, n.channel), self.settings.default_locale)
            rendered = apply(found, n, self.settings)
            if isinstance(rendered, str):
                return rendered
            n = rendered
        reason = row_problem(n, self.chains, self.settings)
        if reason is None and n.guard is not None and n.guard not in self.guards:
            known = ", ".join(sorted(self.guards)) or "none"
            return f"unknown guard {n.guard!r}; this deployment has: {known}"
        return reason

    def _unrendered_problem(self, n: Notification) -> str | None:
        """A templated row's checks that do not depend on its message: its channel and
        recipient."""
        chain = self.chains.get(n.channel)
        if not chain:
            return unknown_channel(n.channel, self.chains)
        reason = recipient_problem(n.recipient, chain[0])
        return None if reason is None else f"invalid notification: {reason}"

    def recipient_check(self, channel: str) -> Callable[[str], str | None]:
        """Why no row of ``channel`` can be sent to a recipient (``checks.recipient_problem``
        through the channel's first provider; ``None`` if one may be), for a campaign's
        audience, line by line; ``ValueError`` if no provider serves ``channel``."""
        chain = self.chains.get(channel)
        if not chain:
            raise ValueError(unknown_channel(channel, self.chains))
        return functools.partial(recipient_problem, provider=chain[0])


def would_be(
    *,
    channel: str,
    recipient: str,
    subject: str | None = None,
    body: str | None = None,
    payload: Any = None,
    dedupe_key: str | None = None,
    guard: str | None = None,
    template: str | None = None,
    locale: str | None = None,
    category: str | None = None,
    max_attempts: int = 5,
    priority: int = 0,
    profile: Profile | None = None,
) -> Notification:
    """The row a worker would claim once these values are written (its first attempt)."""
    return Notification(
        id=0,
        channel=channel,
        recipient=recipient,
        subject=subject,
        body=body,
        payload={} if payload is None else payload,
        attempts=1,
        max_attempts=max_attempts,
        claim_token=NO_CLAIM,
        created_at=datetime.now(UTC),
        dedupe_key=dedupe_key,
        priority=priority,
        guard=guard,
        template=template,
        locale=locale,
        category=category,
        profile=profile,
    )


def unstorable_json(field: str, document: str) -> str | None:
    """Why PostgreSQL's jsonb refuses the JSON text ``document`` (written with
    ``ensure_ascii=False``), naming ``field``; ``None`` if it takes it."""
    if _JSON_NUL.search(document):
        return f"{field} holds a NUL character (\\u0000), which PostgreSQL cannot store; remove it"
    return _not_unicode(field, document)


#: The claim token of a row not claimed yet.
NO_CLAIM = uuid.UUID(int=0)


def _unstorable(n: Notification) -> str | None:
    texts = [value for value in _TEXTS_OF(n) if isinstance(value, str)]
    whole = "".join(texts)  # the usual row, checked at once; a bad one field by field
    if "\x00" not in whole and _not_unicode("", whole) is None:
        return _long_key(n)
    for field in _TEXT_FIELDS:
        value = getattr(n, field)
        if not isinstance(value, str):
            continue
        if "\x00" in value:
            return f"{field} holds a NUL character, which PostgreSQL cannot store; remove it"
        problem = _not_unicode(field, value)
        if problem is not None:
            return problem
    return _long_key(n)


def _long_key(n: Notification) -> str | None:
    if n.dedupe_key is not None:
        size = len(n.dedupe_key.encode())
        if size > DEDUPE_KEY_BYTES:
            return (
                f"dedupe key is {size} bytes; at most {DEDUPE_KEY_BYTES} allowed: use a shorter"
                " key, or a hash of a long one"
            )
    return None


def _not_unicode(field: str, value: str) -> str | None:
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        return (
            f"{field} is not valid Unicode text (a lone surrogate at character {exc.start}),"
            " which PostgreSQL cannot store"
        )
    return None


_cached: tuple[Settings, Intake] | None = None
_lock = threading.Lock()


def intake_for(settings: Settings) -> Intake:
    """The ``Intake`` of these settings, made once per settings object (the process's, as
    ``get_settings`` returns it): loading the providers is not worth repeating per row."""
    global _cached
    with _lock:
        if _cached is None or _cached[0] is not settings:
            _cached = (settings, Intake(settings))
        return _cached[1]
