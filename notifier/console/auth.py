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

from notifier.specs import Role, User, parse_hash

#: scrypt's cost: 16 MiB of memory and about 50 ms per check on a server core.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
SALT_BYTES = 16
KEY_BYTES = 32


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _maxmem(n: int, r: int) -> int:
    """What scrypt needs: OpenSSL's default limit (32 MiB) refuses n=2**15 and above."""
    return 256 * n * r + 2**20


def hash_password(password: str, *, n: int = SCRYPT_N) -> str:
    """A new hash of ``password`` with a fresh salt, for ``NOTIFIER_CONSOLE_USERS``."""
    if not password:
        raise ValueError("a password cannot be empty")
    salt = secrets.token_bytes(SALT_BYTES)
    key = hashlib.scrypt(
        password.encode(),
        salt=salt,
        n=n,
        r=SCRYPT_R,
        p=SCRYPT_P,
        dklen=KEY_BYTES,
        maxmem=_maxmem(n, SCRYPT_R),
    )
    return f"scrypt.{n}.{SCRYPT_R}.{SCRYPT_P}.{_b64(salt)}.{_b64(key)}"


def verify_password(password: str, encoded: str) -> bool:
    """Whether ``password`` matches ``encoded``, compared in constant time."""
    n, r, p, salt, key = parse_hash(encoded)
    got = hashlib.scrypt(
        password.encode(), salt=salt, n=n, r=r, p=p, dklen=len(key), maxmem=_maxmem(n, r)
    )
    return hmac.compare_digest(got, key)


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
