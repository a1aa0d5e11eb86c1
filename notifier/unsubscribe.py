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


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@functools.lru_cache(maxsize=4)
def _cipher(secret: str) -> ChaCha20Poly1305:
    key = HKDF(hashes.SHA256(), 32, salt=None, info=_CONTEXT + b"token key").derive(secret.encode())
    return ChaCha20Poly1305(key)


def make_token(secret: str, channel: str, recipient: str, category: str) -> str:
    payload = "\0".join((channel, recipient, category)).encode()
    nonce = os.urandom(_NONCE)
    return _b64(nonce + _cipher(secret).encrypt(nonce, payload, _CONTEXT))


def read_token(secret: str, token: str) -> Subscription | None:
    """The subscription a token names, or ``None`` if it is not one this secret made."""
    if len(token) > MAX_TOKEN:
        return None
    if "." in token:
        return _read_legacy(secret, token)
    try:
        sealed = _unb64(token)
    except (binascii.Error, ValueError):
        return None
    if len(sealed) <= _NONCE:
        return None
    try:
        payload = _cipher(secret).decrypt(sealed[:_NONCE], sealed[_NONCE:], _CONTEXT)
    except InvalidTag:
        return None
    parts = payload.decode("utf-8", "replace").split("\0")
    # An empty category: the link of a message without one, which opts out of everything.
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
    settings: Settings, channel: str, recipient: str, category: str | None
) -> dict[str, str]:
    """The List-Unsubscribe headers for a message of ``category``, whose link opts out of that
    category; for a message without one (a row that asked with ``payload.unsubscribe``), a link
    that opts out of everything. None when the deployment has no ``NOTIFIER_EVENTS_PUBLIC_URL``
    and ``NOTIFIER_UNSUBSCRIBE_SECRET`` to offer them with."""
    base, secret = settings.events_public_url, settings.unsubscribe_secret
    if not base or not secret:
        return {}
    token = make_token(secret, channel, recipient, category or "")
    targets = [f"<{base.rstrip('/')}/u/{token}>"]
    if settings.unsubscribe_mailto:
        subject = quote(f"unsubscribe {token}")
        targets.append(f"<mailto:{settings.unsubscribe_mailto}?subject={subject}>")
    return {
        "List-Unsubscribe": ", ".join(targets),
        "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
    }
