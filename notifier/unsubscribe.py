"""One-click unsubscribe tokens and headers (RFC 8058 on top of RFC 2369's List-Unsubscribe).

A token names a channel, a recipient and a category (the message's: ``marketing``, a
campaign's own) and says nothing of them to whoever reads it: it is their ChaCha20-Poly1305
encryption under a key derived from ``NOTIFIER_UNSUBSCRIBE_SECRET`` (HKDF-SHA256), with a
random nonce, ``base64url(nonce || ciphertext || tag)``. Without the secret no token can be
made, read or changed into another. The recipient is sealed as the row has it: the opt-out it
becomes is stored by the suppression list's one rule (``suppression_recipient``), as the row is
looked up. A row without a category that asks for a link (``payload.unsubscribe``) gets one
with an empty category, which opts out of everything, as every link did before categories.

Tokens of the earlier form (``base64url(channel NUL recipient NUL campaign) "." base64url(
HMAC-SHA256)``) are still in mailboxes and keep working: they came only from campaigns and
``payload.unsubscribe`` rows, so they opt out of ``marketing``.

Emails that ask for it carry, as RFC 8058 section 3.1 requires::

    List-Unsubscribe: <https://events.example.com/u/TOKEN>,
     <mailto:unsub@example.com?subject=unsubscribe%20TOKEN>
    List-Unsubscribe-Post: List-Unsubscribe=One-Click

and a mailbox provider's POST of ``List-Unsubscribe=One-Click`` to the https URL opts the
recipient out of the category (``notifier.events.app``). The headers must be covered by the
relay's DKIM signature, which RFC 8058 section 4 asks for; relays sign every header by default.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import os
from dataclasses import dataclass
from urllib.parse import quote

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from notifier.settings import Settings

_CONTEXT = b"notifier-unsubscribe\0"
_NONCE = 12
#: What the earlier tokens' opt-outs now mean: every one came from a promotional message.
LEGACY_CATEGORY = "marketing"
#: Longer than any token notifier makes (a recipient is at most 2,048 characters).
MAX_TOKEN = 4096


@dataclass(frozen=True, slots=True)
class Subscription:
    channel: str
    recipient: str
    category: str
    #: the person the message was for, when its row named a profile: the confirmation page
    #: links to their preference center
    profile: str | None = None


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@functools.lru_cache(maxsize=8)
def _cipher(secret: str, context: bytes) -> ChaCha20Poly1305:
    key = HKDF(hashes.SHA256(), 32, salt=None, info=context + b"token key").derive(secret.encode())
    return ChaCha20Poly1305(key)


def seal(secret: str, payload: str, context: bytes = _CONTEXT) -> str:
    """``payload`` encrypted and authenticated under a key of ``secret`` for ``context`` (what
    the token is for: a token of one context is no token of another), as URL-safe text."""
    nonce = os.urandom(_NONCE)
    return _b64(nonce + _cipher(secret, context).encrypt(nonce, payload.encode(), context))


def unseal(secret: str, token: str, context: bytes = _CONTEXT) -> str | None:
    """What ``seal`` sealed in ``token`` for ``context``, or ``None`` if this secret did not."""
    if len(token) > MAX_TOKEN:
        return None
    try:
        sealed = _unb64(token)
    except (binascii.Error, ValueError):
        return None
    if len(sealed) <= _NONCE:
        return None
    try:
        payload = _cipher(secret, context).decrypt(sealed[:_NONCE], sealed[_NONCE:], context)
    except InvalidTag:
        return None
    return payload.decode("utf-8", "replace")


def make_token(
    secret: str, channel: str, recipient: str, category: str, profile: str | None = None
) -> str:
    parts = (
        (channel, recipient, category)
        if profile is None
        else (channel, recipient, category, profile)
    )
    return seal(secret, "\0".join(parts))


def read_token(secret: str, token: str) -> Subscription | None:
    """The subscription a token names, or ``None`` if it is not one this secret made."""
    if len(token) > MAX_TOKEN:
        return None
    if "." in token:
        return _read_legacy(secret, token)
    payload = unseal(secret, token)
    if payload is None:
        return None
    parts = payload.split("\0")
    # An empty category: the link of a message without one, which opts out of everything.
    if len(parts) == 4 and all(parts[:2]) and parts[3]:
        return Subscription(*parts)
    return Subscription(*parts) if len(parts) == 3 and all(parts[:2]) else None


def _read_legacy(secret: str, token: str) -> Subscription | None:
    encoded, _, mac = token.partition(".")
    try:
        payload, given = _unb64(encoded), _unb64(mac)
    except (binascii.Error, ValueError):
        return None
    expected = hmac.new(secret.encode(), _CONTEXT + payload, hashlib.sha256).digest()
    if not hmac.compare_digest(given, expected):
        return None
    parts = payload.decode("utf-8", "replace").split("\0")
    if len(parts) != 3:
        return None
    return Subscription(parts[0], parts[1], LEGACY_CATEGORY)


def headers(
    settings: Settings,
    channel: str,
    recipient: str,
    category: str | None,
    profile: str | None = None,
) -> dict[str, str]:
    """The List-Unsubscribe headers for a message of ``category``, whose link opts out of that
    category; for a message without one (a row that asked with ``payload.unsubscribe``), a link
    that opts out of everything. None when the deployment has no ``NOTIFIER_EVENTS_PUBLIC_URL``
    and ``NOTIFIER_UNSUBSCRIBE_SECRET`` to offer them with."""
    base, secret = settings.events_public_url, settings.unsubscribe_secret
    if not base or not secret:
        return {}
    token = make_token(secret, channel, recipient, category or "", profile)
    targets = [f"<{base.rstrip('/')}/u/{token}>"]
    if settings.unsubscribe_mailto:
        subject = quote(f"unsubscribe {token}")
        targets.append(f"<mailto:{settings.unsubscribe_mailto}?subject={subject}>")
    return {
        "List-Unsubscribe": ", ".join(targets),
        "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
    }


#: The context of preference-center tokens: sealed like unsubscribe tokens, never one of them.
PREFERENCES = b"notifier-preferences\0"


def preferences_token(secret: str, profile_id: str) -> str:
    """A token naming a profile for its preference center (``notifier.preference_center``)."""
    return seal(secret, profile_id, PREFERENCES)


def read_preferences_token(secret: str, token: str) -> str | None:
    """The profile id a preference-center token names, or ``None`` if this secret made none."""
    return unseal(secret, token, PREFERENCES) or None


def preferences_url(settings: Settings, profile_id: str) -> str | None:
    """The person's preference center, or ``None`` where the deployment has none (no
    ``NOTIFIER_PREFERENCE_CENTER``, ``NOTIFIER_EVENTS_PUBLIC_URL`` or secret)."""
    base, secret = settings.events_public_url, settings.unsubscribe_secret
    if not base or not secret or not settings.preference_center:
        return None
    return f"{base.rstrip('/')}/p/{preferences_token(secret, profile_id)}"
