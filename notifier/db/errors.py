"""What a person can do about a database that cannot be reached or refuses them, in one line.

``diagnose`` tells the failures apart by what the driver knows, in this order:

* the SQLSTATE, where the server sent one (once a connection is up: class ``08`` the
  connection, ``28`` the credentials, ``3D000`` the database, ``57P01``-``57P03`` a server
  stopping or starting, ``53300`` no connection slot left);
* psycopg's exception type: ``ConnectionTimeout`` when ``connect_timeout`` passed;
* for a connection attempt that failed (libpq reports no SQLSTATE then: the server's refusal
  comes as text), the libpq connection psycopg hands back: whether it asked for a password,
  used one, which ``sslmode`` was required; then libpq's own error, its first line;
* an ``OperationalError`` without a libpq connection at all: psycopg could not resolve the
  host name, which happens before libpq is asked to connect.

Each gives one line naming ``NOTIFIER_DATABASE_URL`` (its host, port, user and database, never
its password) and the fix. Anything else (a query's own error) is not for this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import psycopg
from psycopg.pq import ConnStatus
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError

#: What ``main`` catches to ask ``diagnose`` about: SQLAlchemy's wrapped errors and psycopg's
#: own (a statement run on the driver's cursor raises those unwrapped).
DRIVER_ERRORS: tuple[type[Exception], ...] = (DBAPIError, psycopg.Error)

SETTING = "NOTIFIER_DATABASE_URL"

_MISSING = re.compile(r'database "([^"]*)" does not exist')
#: The SQLSTATEs of a refused login: invalid_authorization_specification, invalid_password.
_CREDENTIALS = frozenset({"28000", "28P01"})
#: A server shutting down (admin, crash) or starting up, and one with no slot left.
_SERVER_BUSY = frozenset({"57P01", "57P02", "57P03", "53300"})
#: What the server's refusal of a login names: the role, its authentication, pg_hba.conf.
_LOGIN = re.compile(r'role "|authentication|pg_hba\.conf')
_TLS_REQUIRED = frozenset({"require", "verify-ca", "verify-full"})
#: One server's failed attempt, as psycopg lists each when the URL names several.
_ATTEMPT = re.compile(r'connection to server at "([^"]*)"[^,\n]*, port (\d+) failed: ([^\n]*)')
#: libpq turning a standby down because ``target_session_attrs`` asks for a server that writes.
_READ_ONLY = re.compile(r"session is read-only|server is in hot standby mode")


@dataclass(frozen=True, slots=True)
class Problem:
    """One line for the operator, and whether it is the database itself that is missing
    (``notifier migrate`` creates it) rather than a server that cannot be reached or refuses."""

    line: str
    missing: bool = False


def diagnose(exc: BaseException, database_url: str) -> Problem | None:
    """The ``Problem`` when ``exc`` is a failure to reach, log in to or find the database
    ``database_url`` names; ``None`` for any other error."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    if not isinstance(orig, psycopg.Error):
        return None
    target = _Target.of(database_url)
    sqlstate = orig.sqlstate
    if sqlstate is not None:
        return _by_sqlstate(sqlstate, orig, target)
    if isinstance(orig, psycopg.errors.ConnectionTimeout):
        return Problem(
            f"cannot reach PostgreSQL at {target.where} ({SETTING}): no answer within"
            f" {target.timeout}: check the host and port, and that a firewall lets the"
            " connection through"
        )
    if not isinstance(orig, psycopg.OperationalError | psycopg.InterfaceError):
        return None
    pgconn = orig.pgconn
    if pgconn is None:
        if not isinstance(orig, psycopg.OperationalError):
            return None
        # psycopg resolves host names itself before handing libpq an address
        return Problem(
            f"cannot reach PostgreSQL: the host {target.host!r} does not resolve ({SETTING}):"
            " correct the host name, or check this machine's DNS"
        )
    if pgconn.status != ConnStatus.BAD:
        return None
    return _refused(pgconn, _libpq_reason(pgconn, orig), target)


@dataclass(frozen=True, slots=True)
class _Target:
    host: str
    where: str
    user: str
    database: str
    timeout: str
    tls_required: bool

    @classmethod
    def of(cls, database_url: str) -> _Target:
        try:
            url: URL = make_url(database_url)
        except ArgumentError:
            return cls("?", "?", "?", "?", "connect_timeout", tls_required=False)
        hosts, where = _servers(url)
        timeout = url.query.get("connect_timeout")
        sslmode = url.query.get("sslmode")
        return cls(
            ", ".join(hosts),
            ", ".join(where),
            url.username or "(the operating system user)",
            url.database or "(the user's name)",
            f"{timeout}s (connect_timeout)" if isinstance(timeout, str) else "the timeout",
            isinstance(sslmode, str) and sslmode in _TLS_REQUIRED,
        )


def _servers(url: URL) -> tuple[list[str], list[str]]:
    """The hosts the URL names, and each as ``host:port`` (a socket's directory as it is): one,
    or several in the query (``?host=h1:p1&host=h2:p2``, or ``?host=h1,h2&port=p1,p2``)."""
    listed = url.query.get("host")
    if url.host or not listed:  # the authority's one host (an IPv6 address holds colons)
        host = url.host or "localhost"
        return [host], [f"{host}:{url.port or 5432}"]
    entries = list(listed) if isinstance(listed, tuple) else listed.split(",")
    given = url.query.get("port")
    ports = given.split(",") if isinstance(given, str) else ["5432"]
    hosts, where = [], []
    for i, entry in enumerate(entries):
        host, _, port = entry.partition(":")
        hosts.append(host)
        if not port:
            port = ports[i] if i < len(ports) else ports[-1]
        where.append(host if host.startswith("/") else f"{host}:{port}")
    return hosts, where


def _by_sqlstate(sqlstate: str, orig: psycopg.Error, target: _Target) -> Problem | None:
    reason = _first_line(orig.diag.message_primary or str(orig))
    if sqlstate == "3D000":
        return _missing(target)
    if sqlstate in _CREDENTIALS:
        return _login_refused(target, reason)
    if sqlstate.startswith("08") or sqlstate in _SERVER_BUSY:
        return Problem(f"lost the connection to PostgreSQL at {target.where} ({SETTING}): {reason}")
    return None


def _refused(pgconn: psycopg.pq.abc.PGconn, reason: str, target: _Target) -> Problem:
    """A connection attempt that failed, from what libpq's connection says about it."""
    if _MISSING.search(reason):
        return _missing(target)
    if pgconn.needs_password:
        return Problem(
            f"PostgreSQL at {target.where} asks user {target.user!r} for a password and"
            f" {SETTING} gives none: add it (postgresql://USER:PASSWORD@HOST/DB), or a"
            " ~/.pgpass entry"
        )
    if reason.startswith("FATAL:"):  # the server answered, and turned the login down
        said = reason.removeprefix("FATAL:").strip()
        if pgconn.used_password or _LOGIN.search(said):
            return _login_refused(target, said)
        return Problem(  # starting up, shutting down, no connection slot left
            f"PostgreSQL at {target.where} turned the connection away ({SETTING}): {said}:"
            " try again once it is up, or ask its administrator"
        )
    if _READ_ONLY.search(reason):
        return Problem(
            f"no PostgreSQL at {target.where} takes writes ({SETTING}, target_session_attrs):"
            f" {reason}: a standby answered where the primary is needed: wait for a standby"
            " to be promoted, or name the primary's host"
        )
    if target.tls_required and "SSL" in reason:
        return Problem(
            f"PostgreSQL at {target.where} does not offer TLS, which {SETTING} requires"
            f" (sslmode): {reason}: enable ssl on the server, or lower sslmode"
        )
    return Problem(
        f"cannot reach PostgreSQL at {target.where} ({SETTING}): {reason}: check that"
        " PostgreSQL runs there, and the host and port"
    )


def _missing(target: _Target) -> Problem:
    return Problem(
        f"database {target.database!r} does not exist on {target.where} ({SETTING}):"
        " correct the name, or create it with `notifier migrate`",
        missing=True,
    )


def _login_refused(target: _Target, reason: str) -> Problem:
    return Problem(
        f"PostgreSQL at {target.where} refused user {target.user!r} ({SETTING}): {reason}:"
        " correct the user and password, or let the role log in (ALTER ROLE ... LOGIN)"
    )


def _libpq_reason(pgconn: psycopg.pq.abc.PGconn, orig: psycopg.Error) -> str:
    """libpq's reason for the failed attempt: its message's first line, past the address
    (``connection to server at "h" (a), port p failed: REASON``); with several servers tried,
    each one's, in the order tried (psycopg lists them after its first line)."""
    tried = dict.fromkeys(_ATTEMPT.findall(str(orig).partition("All failures were:")[2]))
    if len(tried) > 1:
        return "; ".join(f"{host}:{port}: {why.strip()}" for host, port, why in tried)
    message = pgconn.error_message.decode(errors="replace") or str(orig)
    return _first_line(message).rpartition(" failed: ")[2].strip()


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else "no reason given"
