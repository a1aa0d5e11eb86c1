"""Who may use the console: password hashes, the user list, sessions and CSRF tokens.

Users come from ``NOTIFIER_CONSOLE_USERS``: ``name:hash:role`` entries separated by commas,
``role`` ``admin`` (sees and acts) or ``viewer`` (sees only). A hash is made by ``notifier
console hash-password``: scrypt (RFC 7914, from the standard library) with a random salt,
written ``scrypt.N.r.p.salt.hash`` in unpadded URL-safe base64, so it holds none of ``:``,
``,`` or ``$`` (which compose would read as a variable).

Sessions live in the console process's memory, keyed by a random token in an HttpOnly,
SameSite=Strict cookie: logging out or restarting the console ends them for good, and nothing
needs a signing key. Each session carries its own CSRF token, which every form posts back.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass, field
from enum import StrEnum

#: scrypt's cost: 16 MiB of memory and about 50 ms per check on a server core.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
SALT_BYTES = 16
KEY_BYTES = 32


class Role(StrEnum):
    """What a console user may do."""

    #: everything a viewer may, and every action (requeue, cancel, pause, suppress, ...)
    admin = "admin"
    #: sees every page; every action is refused
    viewer = "viewer"


@dataclass(frozen=True, slots=True)
class User:
    name: str
    password_hash: str
    role: Role


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def hash_password(password: str, *, n: int = SCRYPT_N) -> str:
    """A new hash of ``password`` with a fresh salt, for ``NOTIFIER_CONSOLE_USERS``."""
    if not password:
        raise ValueError("a password cannot be empty")
    salt = secrets.token_bytes(SALT_BYTES)
    key = hashlib.scrypt(password.encode(), salt=salt, n=n, r=SCRYPT_R, p=SCRYPT_P, dklen=KEY_BYTES)
    return f"scrypt.{n}.{SCRYPT_R}.{SCRYPT_P}.{_b64(salt)}.{_b64(key)}"


def _parse_hash(encoded: str) -> tuple[int, int, int, bytes, bytes]:
    parts = encoded.split(".")
    if len(parts) != 6 or parts[0] != "scrypt":
        raise ValueError("is not a hash made by notifier console hash-password")
    try:
        n, r, p = (int(x) for x in parts[1:4])
        salt, key = _unb64(parts[4]), _unb64(parts[5])
    except ValueError:
        raise ValueError("is not a hash made by notifier console hash-password") from None
    if n < 2**10 or n & (n - 1) or not 0 < r <= 32 or not 0 < p <= 16 or len(key) < 16:
        raise ValueError("has scrypt parameters too weak or malformed")
    return n, r, p, salt, key


def verify_password(password: str, encoded: str) -> bool:
    """Whether ``password`` matches ``encoded``, compared in constant time."""
    n, r, p, salt, key = _parse_hash(encoded)
    # maxmem: OpenSSL's default (32 MiB) refuses n=2**15 and above.
    got = hashlib.scrypt(
        password.encode(), salt=salt, n=n, r=r, p=p, dklen=len(key), maxmem=256 * n * r + 2**20
    )
    return hmac.compare_digest(got, key)


def parse_users(spec: str) -> dict[str, User]:
    """``NOTIFIER_CONSOLE_USERS`` -> users by name; ``ValueError`` naming the bad entry (by its
    position and user name, never its hash)."""
    users: dict[str, User] = {}
    for position, entry in enumerate(filter(None, (e.strip() for e in spec.split(","))), 1):
        parts = entry.split(":")
        if len(parts) != 3:
            raise ValueError(f"entry {position} is not name:hash:role")
        name, encoded, role = (p.strip() for p in parts)
        if not name:
            raise ValueError(f"entry {position} has no user name")
        if role not in Role.__members__:
            raise ValueError(f"user {name!r}: role must be admin or viewer, not {role!r}")
        try:
            _parse_hash(encoded)
        except ValueError as exc:
            raise ValueError(f"user {name!r}: the password hash {exc}") from None
        if name in users:
            raise ValueError(f"user {name!r} is listed twice")
        users[name] = User(name, encoded, Role(role))
    return users


@functools.cache
def _decoy() -> str:
    """A hash checked for unknown user names, so that a login with one takes as long as with a
    known name and a wrong password."""
    return hash_password(secrets.token_urlsafe(16))


def authenticate(users: dict[str, User], name: str, password: str) -> User | None:
    user = users.get(name)
    ok = verify_password(password, user.password_hash if user else _decoy())
    return user if ok and user is not None else None


@dataclass(slots=True)
class Session:
    user: str
    role: Role
    csrf: str
    expires: float
    #: filters the operator submitted, by an opaque id, so no recipient goes into a URL
    searches: dict[str, dict[str, str]] = field(default_factory=dict)


class Sessions:
    """Sessions by their token, in memory; each expires ``lifetime`` seconds after login."""

    def __init__(self, lifetime: float) -> None:
        self.lifetime = lifetime
        self._by_token: dict[str, Session] = {}
        self._lock = threading.Lock()

    def start(self, user: User) -> tuple[str, Session]:
        token = secrets.token_urlsafe(32)
        session = Session(user.name, user.role, secrets.token_urlsafe(32), 0.0)
        session.expires = time.monotonic() + self.lifetime
        with self._lock:
            now = time.monotonic()
            self._by_token = {t: s for t, s in self._by_token.items() if s.expires > now}
            self._by_token[token] = session
        return token, session

    def get(self, token: str | None) -> Session | None:
        if not token:
            return None
        with self._lock:
            session = self._by_token.get(token)
            if session is not None and session.expires <= time.monotonic():
                del self._by_token[token]
                return None
            return session

    def end(self, token: str | None) -> None:
        with self._lock:
            self._by_token.pop(token or "", None)


def csrf_ok(session: Session, submitted: str | None) -> bool:
    return bool(submitted) and hmac.compare_digest(session.csrf, submitted or "")
