"""What the HTTP senders share: one blocking client for a provider's send threads, reading a
``Retry-After``, and ``post``: one signed JSON POST on aiohttp whose answer becomes an outcome,
for the ``webhook`` channel and the status webhook alike.

``post`` never follows a redirect, so it cannot lead anywhere unchecked; a session that guards
its addresses (``netguard``) makes a refused one a permanent failure.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import aiohttp
import httpx
import yarl

from notifier.models import truncate
from notifier.providers.base import Outcome, Permanent, Retry, Sent
from notifier.providers.netguard import BlockedAddress, is_loopback
from notifier.signing import signed_headers

ERROR_BODY_BYTES = 1024

#: Reads a provider's answer into the outcome of its request (``post``'s ``answer``).
Answer = Callable[[aiohttp.ClientResponse], Awaitable[Outcome]]


class SharedClient:
    """One ``httpx.Client`` for every send thread of a provider, made on first use.

    It is kept across batches, so connections to the provider are reused; ``close`` lets them
    go (worker shutdown, tests), and a later ``get`` makes a new client.
    """

    def __init__(self, make: Callable[[], httpx.Client]) -> None:
        self._make = make
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    def get(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                self._client = self._make()
            return self._client

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


class LoopSession:
    """One ``aiohttp.ClientSession`` of a provider, made by ``make`` on first use on the loop
    that sends (a session belongs to one loop), kept across batches so connections are reused;
    ``close`` really closes it (worker shutdown, tests), and a later ``get`` makes a new one."""

    def __init__(self, make: Callable[[], aiohttp.ClientSession], owner: str) -> None:
        self._make = make
        self._owner = owner
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> aiohttp.ClientSession:
        """The session of the running loop."""
        loop = asyncio.get_running_loop()
        if self._session is not None and self._loop is not loop:
            if self._loop is not None and not self._loop.is_closed():
                raise RuntimeError(f"{self._owner} is already sending on another event loop")
            self._session = None  # its loop is gone, and its connections with it
        if self._session is None:
            self._session, self._loop = self._make(), loop
        return self._session

    def close(self) -> None:
        """Close the session; call it from a thread, not from a coroutine on its loop."""
        session, loop = self._session, self._loop
        self._session = self._loop = None
        if session is None or loop is None or loop.is_closed():
            return
        if loop.is_running():
            asyncio.run_coroutine_threadsafe(session.close(), loop).result(timeout=10)
        else:
            loop.run_until_complete(session.close())


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds a ``Retry-After`` asks for (delta-seconds or an HTTP-date); ``None`` if unusable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        at = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if at.tzinfo is None:  # "-0000" dates parse naive; HTTP-dates are always GMT
        at = at.replace(tzinfo=UTC)
    return max(0.0, (at - (now or datetime.now(UTC))).total_seconds())


async def post(
    session: aiohttp.ClientSession,
    url: yarl.URL,
    msg_id: str,
    body: bytes,
    key: bytes | None,
    *,
    headers: Mapping[str, str] | None = None,
    answer: Answer | None = None,
) -> Outcome:
    """POST ``body``, signed, to ``url`` without following redirects; every failure becomes an
    outcome, within the session's timeouts.

    A provider's API passes its own ``headers`` (content type, credentials) instead of the
    Standard Webhooks ones, and its own ``answer``, which reads the response (within the same
    timeouts) into an outcome; by default a webhook receiver's status decides.
    """
    host = _host_and_port(url)
    sent = {
        "Accept-Encoding": "identity",  # the error text is read raw, never decompressed
        **(
            {"Content-Type": "application/json", **signed_headers(key, msg_id, body)}
            if headers is None
            else headers
        ),
    }
    try:
        request = session.post(url, data=body, headers=sent, allow_redirects=False)
        async with request as response:
            if answer is not None:
                return await answer(response)
            return await _outcome(response, msg_id, host, receiver_scope(url))
    except BlockedAddress as exc:  # raised by the connection, before anything was sent
        return Permanent(str(exc))
    except TimeoutError as exc:  # aiohttp's timeouts are TimeoutErrors too
        return Retry(_timed_out(exc, host, session.timeout))
    except aiohttp.InvalidURL as exc:  # e.g. a legacy numeric IPv4 host: never called
        return Permanent(truncate(f"recipient URL is malformed: {exc}"))
    except aiohttp.ClientConnectorError as exc:  # DNS failures too
        return Retry(truncate(f"ConnectError POSTing to {host}: {exc.strerror or exc}"))
    except aiohttp.ClientResponseError as exc:  # not HTTP; its str() repeats the whole URL
        return Retry(truncate(f"{type(exc).__name__} POSTing to {host}: {exc.message}"))
    except (aiohttp.ClientError, OSError) as exc:
        return Retry(truncate(f"{type(exc).__name__} POSTing to {host}: {exc}"))


def _timed_out(exc: TimeoutError, host: str, timeouts: aiohttp.ClientTimeout) -> str:
    if isinstance(exc, aiohttp.ServerTimeoutError):
        kind = (
            "ConnectTimeout" if isinstance(exc, aiohttp.ConnectionTimeoutError) else "ReadTimeout"
        )
        return f"timed out ({kind}) after the {timeouts.connect:g}s limit POSTing to {host}"
    return f"timed out (the whole send) after its {timeouts.total:g}s limit POSTing to {host}"


async def _outcome(
    response: aiohttp.ClientResponse, msg_id: str, host: str, scope: str | None
) -> Outcome:
    """What the receiver's answer means for the row."""
    status = response.status
    if 200 <= status < 300:
        await _read_some(response)  # an exhausted small body lets the connection be reused
        return Sent(msg_id)
    if 300 <= status < 400:
        location = response.headers.get("location", "nowhere")
        return Permanent(
            f"HTTP {status} redirect to {truncate(location, 200)}; redirects are "
            "not followed, update the URL"
        )
    error = f"HTTP {status} from {host}: {truncate(await _read_some(response), 300)}"
    if status in (408, 429) or status >= 500:
        retry_after = parse_retry_after(response.headers.get("retry-after"))
        return Retry(error, retry_after, throttled=status == 429, scope=scope)
    return Permanent(error)


async def _read_some(response: aiohttp.ClientResponse) -> str:
    """At most ``ERROR_BODY_BYTES`` of the body: enough to explain an error, bounded in size."""
    return (await read_capped(response, ERROR_BODY_BYTES)).decode("utf-8", errors="replace")


async def read_capped(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """At most ``limit`` bytes of the body, so that a runaway answer cannot fill memory."""
    chunks = bytearray()
    while len(chunks) < limit:
        chunk = await response.content.read(limit - len(chunks))
        if not chunk:
            break
        chunks += chunk
    return bytes(chunks)


def operator_url_problem(url: str, setting: str) -> str | None:
    """Why ``url``, an API base the operator configured, is unusable; ``None`` if it is not.

    Operator URLs are trusted (no SSRF guard) but carry credentials, so they must be https;
    plain http only on loopback, where tests and local fakes listen.
    """
    try:
        parsed = yarl.URL(url)
        parsed.port  # noqa: B018 - raises on a port that is not a number in range
    except (ValueError, TypeError):
        return f"{setting} {url!r} is not an https:// URL"
    host = parsed.host or ""
    if not host or parsed.scheme not in ("http", "https"):
        return f"{setting} {url!r} is not an https:// URL"
    if parsed.scheme == "http" and not is_loopback(host):
        return (
            f"{setting} {url!r} uses plain http; use https (credentials are in every "
            "request; http is only accepted on loopback)"
        )
    return None


def receiver_scope(url: str | yarl.URL) -> str | None:
    """``webhook:host:port`` of a receiver: a 429 holds back that receiver alone."""
    try:
        parsed = url if isinstance(url, yarl.URL) else yarl.URL(url)
        return f"webhook:{(parsed.host or '').lower()}:{parsed.port}" if parsed.host else None
    except ValueError:
        return None


def _host_and_port(url: yarl.URL) -> str:
    """How errors name the target: host, and the port when the URL gives one."""
    port = url.explicit_port
    return (url.host or "") + (f":{port}" if port is not None else "")
