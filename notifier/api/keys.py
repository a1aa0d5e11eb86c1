"""API keys: made, shown once, stored as a hash, and checked.

A key reads ``nk_<10 characters>.<43 characters>``: the part before the dot is its public
prefix (stored, listed, logged), the whole key's SHA-256 is stored beside it. A key is 32 bytes
from ``secrets``: guessing one is hopeless, so a fast hash loses nothing, and a leaked table
gives no key. Checking compares the hashes in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from notifier.api.bodies import ApiError
from notifier.db.api import KeyRow

PREFIX = "nk_"
_KEY = re.compile(r"(nk_[a-z2-7]{10})\.([A-Za-z0-9_-]{43})")
_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
_ALPHABET = "abcdefghijklmnopqrstuvwxyz234567"


@dataclass(frozen=True, slots=True)
class NewKey:
    """A key as made: ``key`` is shown once and never stored."""

    key: str
    row: KeyRow


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def make(
    name: str,
    *,
    channels: Sequence[str] | None = None,
    categories: Sequence[str] | None = None,
    read_only: bool = False,
    per_second: int | None = None,
) -> NewKey:
    """A new key for the producer ``name``; ``ValueError`` naming what is wrong."""
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"key name {name[:80]!r}: use 1-64 of a-z 0-9 _ . - (it becomes the rows' producer)"
        )
    if per_second is not None and per_second <= 0:
        raise ValueError("per_second must be a positive number of requests")
    prefix = PREFIX + "".join(secrets.choice(_ALPHABET) for _ in range(10))
    key = f"{prefix}.{secrets.token_urlsafe(32)}"
    row = KeyRow(
        id=0,
        name=name,
        prefix=prefix,
        secret_hash=digest(key),
        channels=sorted(set(channels)) if channels else None,
        categories=sorted(set(categories)) if categories else None,
        read_only=read_only,
        per_second=per_second,
    )
    return NewKey(key, row)


def prefix_of(presented: str) -> str | None:
    """The prefix of a well-formed key, or ``None`` for anything else."""
    found = _KEY.fullmatch(presented)
    return None if found is None else found.group(1)


def matches(presented: str, row: KeyRow) -> bool:
    """Whether ``presented`` is the key stored as ``row``."""
    return hmac.compare_digest(digest(presented), bytes(row.secret_hash))


def must_write(key: KeyRow) -> None:
    """Refuse (403) a key that may only read."""
    if key.read_only:
        raise ApiError(403, "read_only_key", "this key may only read: use a key that writes")
