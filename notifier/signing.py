"""Standard Webhooks signing (standardwebhooks.com), for every request notifier POSTs to a
receiver: the ``webhook`` channel's (``NOTIFIER_WEBHOOK_SECRET``) and the status webhook's
(``NOTIFIER_STATUS_WEBHOOK_SECRET``).

A request carries ``webhook-id`` (stable across retries, so receivers can drop duplicates),
``webhook-timestamp`` and, with a key, ``webhook-signature: v1,<base64 HMAC-SHA256 of
"{id}.{timestamp}.{body}">``, which any of the specification's verifier libraries accepts.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time


def signing_key(secret: str, variable: str = "NOTIFIER_WEBHOOK_SECRET") -> bytes:
    """Standard Webhooks secrets are ``whsec_`` + base64; any other string is used as is."""
    if not secret.startswith("whsec_"):
        return secret.encode()
    try:
        return base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except binascii.Error:
        # Say nothing about the value: this text ends up in logs.
        raise ValueError(
            f"{variable} starts with whsec_ but the rest is not valid base64"
        ) from None


def signature(key: bytes, msg_id: str, timestamp: str, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256 of "{msg_id}.{timestamp}.{body}">``."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signed_headers(key: bytes | None, msg_id: str, body: bytes) -> dict[str, str]:
    """A request's Standard Webhooks headers, stamped now: ``webhook-id``,
    ``webhook-timestamp`` and, with a key, ``webhook-signature``."""
    timestamp = str(int(time.time()))
    headers = {"webhook-id": msg_id, "webhook-timestamp": timestamp}
    if key is not None:
        headers["webhook-signature"] = signature(key, msg_id, timestamp, body)
    return headers
