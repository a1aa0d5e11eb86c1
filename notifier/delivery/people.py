"""What the person a row addresses asked for, applied before it is sent: their preference for
the row's category on its channel.

A row that names a ``profile`` and a ``category`` is sent only if the person turned that
category on for its channel, or never chose and the deployment's default for the category
(``NOTIFIER_PREFERENCE_DEFAULTS``) is on. Rows of a critical category
(``NOTIFIER_CRITICAL_CATEGORIES``) and transactional rows (no category) are never held back by
a preference; the suppression list applies to every row alike (``prepare``).
"""

from __future__ import annotations

from collections.abc import Mapping, Set

from notifier.models import Notification


def refusal(n: Notification, defaults: Mapping[str, bool], critical: Set[str]) -> str | None:
    """Why the person ``n`` addresses does not want it, or ``None`` if they do (or it names
    no person, no category, or a critical one)."""
    person, category = n.profile, n.category
    if person is None or category is None or category in critical:
        return None
    if person.enabled is not None:
        return (
            None
            if person.enabled
            else (f"preference: profile {person.id!r} turned {category} off on {n.channel}")
        )
    if defaults.get(category, True):
        return None
    return (
        f"preference: {category} is off on every channel for a person who has not turned it on"
        f" (NOTIFIER_PREFERENCE_DEFAULTS), and profile {person.id!r} has not"
    )
