"""One-click unsubscribe tokens and headers (RFC 8058 on top of RFC 2369's List-Unsubscribe).

A token names a channel, a recipient and a category (a campaign's name, or empty) and carries
an HMAC-SHA256 of them under ``NOTIFIER_UNSUBSCRIBE_SECRET``:
``base64url(channel NUL recipient NUL category) "." base64url(mac)``. Without the secret no
token can be made, and a token's MAC covers its recipient, so it cannot be turned into one for
another address. The email recipient is stored as suppressions compare it (trimmed, lower
case), so ``Ann@Example.com`` and ``ann@example.com`` get the same token.

Emails that ask for it carry, as RFC 8058 section 3.1 requires::

    List-Unsubscribe: <https://events.example.com/u/TOKEN>,
     <mailto:unsub@example.com?subject=unsubscribe%20TOKEN>
    List-Unsubscribe-Post: List-Unsubscribe=One-Click

and a mailbox provider's POST of ``List-Unsubscribe=One-Click`` to the https URL suppresses
the recipient (``notifier.events.app``). The headers must be covered by the relay's DKIM
signature, which RFC 8058 section 4 asks for; relays sign every header by default.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass
from urllib.parse import quote

from notifier.settings import Settings

_CONTEXT = b"notifier-unsubscribe\0"


@dataclass(frozen=True, slots=True)
class Subscription:
    channel: str
    recipient: str
    category: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _normal(channel: str, recipient: str) -> str:
    return recipient.strip().lower() if channel == "email" else recipient


def _mac(secret: str, payload: bytes) -> bytes:
    return hmac.new(secret.encode(), _CONTEXT + payload, hashlib.sha256).digest()


def make_token(secret: str, channel: str, recipient: str, category: str = "") -> str:
    payload = "\0".join((channel, _normal(channel, recipient), category)).encode()
    return f"{_b64(payload)}.{_b64(_mac(secret, payload))}"


def read_token(secret: str, token: str) -> Subscription | None:
    """The subscription a token names, or ``None`` if it is not one this secret signed."""
    encoded, dot, mac = token.partition(".")
    if not dot or len(token) > 4096:
        return None
    try:
        payload, given = _unb64(encoded), _unb64(mac)
    except (binascii.Error, ValueError):
        return None
    if not hmac.compare_digest(given, _mac(secret, payload)):
        return None
    parts = payload.decode("utf-8", "replace").split("\0")
    if len(parts) != 3:
        return None
    return Subscription(*parts)


def headers(settings: Settings, channel: str, recipient: str, category: str) -> dict[str, str]:
    """The List-Unsubscribe headers for a message, or none when the deployment has no
    ``NOTIFIER_EVENTS_PUBLIC_URL`` and ``NOTIFIER_UNSUBSCRIBE_SECRET`` to offer them with."""
    base, secret = settings.events_public_url, settings.unsubscribe_secret
    if not base or not secret:
        return {}
    token = make_token(secret, channel, recipient, category)
    targets = [f"<{base.rstrip('/')}/u/{token}>"]
    if settings.unsubscribe_mailto:
        subject = quote(f"unsubscribe {token}")
        targets.append(f"<mailto:{settings.unsubscribe_mailto}?subject={subject}>")
    return {
        "List-Unsubscribe": ", ".join(targets),
        "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
    }
