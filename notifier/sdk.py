"""A Python client of ``notifier api``, sync (``Client``) and async (``AsyncClient``), on httpx.

    from notifier.sdk import Client

    with Client("https://notify.example.com", key="nk_...") as api:
        made = api.notify("email", to="ann@example.com", subject="Hi", body="Welcome",
                          idempotency_key=f"welcome:{user.id}")
        api.get(made.id).status          # 'pending', then 'sent'
        api.cancel(idempotency_key=f"welcome:{user.id}")

Every write carries an idempotency key (one made up, a UUID, when none is given), so a request
tried again after a timeout, a dropped connection, a 5xx, a 429 or a 409 "under way" is answered
by the row the first try wrote, never a second row. Those are retried ``retries`` times with
exponential back-off and jitter, honouring ``Retry-After``; any other refusal raises
``Refused`` at once with the API's code, field and message.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Self

import httpx

#: Answers a request may be tried again after, with the same idempotency key (and 409 when its
#: code is ``in_progress``: the first try is still being written).
RETRIED = {429, 500, 502, 503, 504}
#: The longest wait between tries, whatever a Retry-After says.
MAX_WAIT = 30.0
#: Items in one batch request (the API's ``NOTIFIER_API_MAX_BATCH`` by default), and how many
#: batch requests ``notify_many`` keeps under way at once: two for each process of ``notifier
#: api --workers 2``, so that each checks one batch's items while the database writes its other
#: one (a batch's Python and its statements take turns; with one each, a process idles while
#: its batch is written).
BATCH = 1_000
IN_FLIGHT = 4


class NotifierError(Exception):
    """The API refused, or could not be reached: ``status`` (0 when it never answered),
    ``code``, ``field`` and a message."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(f"{status} {code}: {message}" + (f" ({field})" if field else ""))
        self.status, self.code, self.message, self.field = status, code, message, field


class Refused(NotifierError):
    """A 4xx that trying again will not change: fix the request."""


class Unavailable(NotifierError):
    """No answer, or only 5xx, 429 or 409 "under way", after every try."""


@dataclass(frozen=True, slots=True)
class Created:
    id: int
    idempotency_key: str | None
    #: the API had written this row for an earlier try with the same key
    replayed: bool


@dataclass(frozen=True, slots=True)
class ItemResult:
    """One item of ``notify_many``: ``created``, ``replayed`` or ``refused`` (with ``error``)."""

    index: int
    status: str
    id: int | None = None
    idempotency_key: str | None = None
    error: NotifierError | None = None


def notification(
    channel: str,
    *,
    to: str | None = None,
    profile: str | None = None,
    subject: str | None = None,
    body: str | None = None,
    payload: Mapping[str, Any] | None = None,
    template: str | None = None,
    locale: str | None = None,
    category: str | None = None,
    send_at: datetime | None = None,
    delay: timedelta | None = None,
    expires_at: datetime | None = None,
    max_attempts: int | None = None,
    priority: int | None = None,
) -> dict[str, Any]:
    """One notification's JSON, as ``notify_many`` takes a list of them."""
    doc: dict[str, Any] = {
        "channel": channel,
        "to": to,
        "profile": profile,
        "subject": subject,
        "body": body,
        "payload": dict(payload) if payload is not None else None,
        "template": template,
        "locale": locale,
        "category": category,
        "send_at": send_at.isoformat() if send_at is not None else None,
        "delay_seconds": delay.total_seconds() if delay is not None else None,
        "expires_at": expires_at.isoformat() if expires_at is not None else None,
        "max_attempts": max_attempts,
        "priority": priority,
    }
    return {k: v for k, v in doc.items() if v is not None}


@dataclass(frozen=True, slots=True)
class _Call:
    method: str
    path: str
    json: Any = None
    params: Mapping[str, str] | None = None
    headers: Mapping[str, str] | None = None


def _error(response: httpx.Response) -> NotifierError:
    try:
        found = response.json()["error"]
        code, message, field = str(found["code"]), str(found["message"]), found.get("field")
    except (ValueError, KeyError, TypeError):
        code, message, field = "unexpected", response.text[:200], None
    kind = Unavailable if _retried(response.status_code, code) else Refused
    return kind(response.status_code, code, message, field)


def _retried(status: int, code: str) -> bool:
    return status in RETRIED or (status == 409 and code == "in_progress")


def _wait(attempt: int, backoff: float, response: httpx.Response | None) -> float:
    given = response.headers.get("retry-after") if response is not None else None
    if given is not None and given.isdigit():
        return min(float(given), MAX_WAIT)
    jitter = 0.5 + random.random() / 2  # spreads the retries of many clients
    return float(min(backoff * 2**attempt, MAX_WAIT) * jitter)


def _writes(idempotency_key: str | None) -> dict[str, str]:
    return {"Idempotency-Key": idempotency_key or str(uuid.uuid4())}


def _keyed(items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The items, each with an ``idempotency_key`` (a new UUID where it has none) that every
    retry of its request sends again."""
    return [
        dict(item) if "idempotency_key" in item else {"idempotency_key": str(uuid.uuid4()), **item}
        for item in items
    ]


def _batches(items: Sequence[Mapping[str, Any]], size: int) -> list[tuple[int, _Call]]:
    """The requests that write ``items``, ``size`` at a time, each with its first item's index."""
    if size < 1:
        raise ValueError(f"batch size must be at least 1, not {size}")
    keyed = _keyed(items)
    return [
        (start, _Call("POST", "/v1/notifications/batch", {"notifications": keyed[at]}))
        for start in range(0, len(keyed), size)
        for at in [slice(start, start + size)]
    ]


def _placed(answer: httpx.Response, start: int) -> list[ItemResult]:
    """A batch's results, their indexes counted from the first item given to ``notify_many``."""
    return _results(answer.json(), start)


def _results(doc: Any, start: int) -> list[ItemResult]:
    found = []
    for r in doc["results"]:
        error = r.get("error")
        found.append(
            ItemResult(
                index=int(r["index"]) + start,
                status=str(r["status"]),
                id=r.get("id"),
                idempotency_key=r.get("idempotency_key"),
                error=Refused(422, error["code"], error["message"], error.get("field"))
                if error
                else None,
            )
        )
    return found


def _by(id: int | None, idempotency_key: str | None) -> tuple[str, dict[str, str] | None]:
    if (id is None) == (idempotency_key is None):
        raise ValueError("give the notification's id or its idempotency_key, one of them")
    if id is not None:
        return f"/v1/notifications/{int(id)}", None
    return "/v1/notifications", {"idempotency_key": str(idempotency_key)}


class _Base:
    def __init__(self, base_url: str, key: str, retries: int, backoff: float) -> None:
        if not key.startswith("nk_"):
            raise ValueError("key: an API key from `notifier api-key create` (nk_...)")
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {key}", "User-Agent": "notifier-sdk"}
        self.retries = retries
        self.backoff = backoff

    def _request(self, call: _Call) -> dict[str, Any]:
        return {
            "method": call.method,
            "url": self.base_url + call.path,
            "json": call.json,
            "params": call.params,
            "headers": {**self.headers, **(call.headers or {})},
        }

    def _outcome(
        self, answer: httpx.Response | httpx.TransportError, attempt: int
    ) -> httpx.Response | float:
        """The response if it is final, or how long to wait before trying again; raises when
        it is refused, or when this was the last try."""
        if isinstance(answer, httpx.Response) and answer.status_code < 400:
            return answer
        if isinstance(answer, httpx.Response):
            error = _error(answer)
        else:
            error = Unavailable(0, "unreachable", str(answer))
        if isinstance(error, Unavailable) and attempt < self.retries:
            return _wait(
                attempt, self.backoff, answer if isinstance(answer, httpx.Response) else None
            )
        raise error


class Client(_Base):
    """The API's client, for threads. Safe to share; ``close`` it (or use ``with``)."""

    def __init__(
        self,
        base_url: str,
        key: str,
        *,
        timeout: float = 10.0,
        retries: int = 4,
        backoff: float = 0.5,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, key, retries, backoff)
        self._http = httpx.Client(timeout=timeout, transport=transport)

    def notify(self, channel: str, *, idempotency_key: str | None = None, **fields: Any) -> Created:
        doc = notification(channel, **fields)
        answer = self._send(_Call("POST", "/v1/notifications", doc, None, _writes(idempotency_key)))
        return Created(**answer.json())

    def notify_many(
        self, items: Sequence[Mapping[str, Any]], *, batch: int = BATCH, in_flight: int = IN_FLIGHT
    ) -> list[ItemResult]:
        """Write any number of items, ``batch`` a request, ``in_flight`` requests at once: a
        result for each, in order. Should a request fail for good, its error is raised once the
        others end; the other requests' items are written, and calling again with the same
        items writes the rest and nothing twice if each item carries its ``idempotency_key``."""
        calls = _batches(items, batch)

        def placed(start: int, call: _Call) -> list[ItemResult]:
            return _placed(self._send(call), start)  # read as it comes, while others are sent

        if len(calls) <= 1:
            return [r for start, call in calls for r in placed(start, call)]
        with ThreadPoolExecutor(max_workers=max(1, min(in_flight, len(calls)))) as pool:
            answers = [pool.submit(placed, start, call) for start, call in calls]
            wait(answers)
        return [r for a in answers for r in a.result()]

    def get(self, id: int | None = None, *, idempotency_key: str | None = None) -> dict[str, Any]:
        path, params = _by(id, idempotency_key)
        result: dict[str, Any] = self._send(_Call("GET", path, params=params)).json()
        return result

    def cancel(self, id: int | None = None, *, idempotency_key: str | None = None) -> bool:
        """True if this cancelled it; False if it had been sent, dead or cancelled already."""
        try:
            self._send(_cancel_call(id, idempotency_key))
        except Refused as exc:
            if exc.code == "final":
                return False
            raise
        return True

    def _send(self, call: _Call) -> httpx.Response:
        for attempt in range(self.retries + 1):
            try:
                answer: httpx.Response | httpx.TransportError = self._http.request(
                    **self._request(call)
                )
            except httpx.TransportError as exc:
                answer = exc
            outcome = self._outcome(answer, attempt)
            if isinstance(outcome, httpx.Response):
                return outcome
            time.sleep(outcome)
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class AsyncClient(_Base):
    """The API's client for asyncio; ``await aclose()`` it (or use ``async with``)."""

    def __init__(
        self,
        base_url: str,
        key: str,
        *,
        timeout: float = 10.0,
        retries: int = 4,
        backoff: float = 0.5,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, key, retries, backoff)
        self._http = httpx.AsyncClient(timeout=timeout, transport=transport)

    async def notify(
        self, channel: str, *, idempotency_key: str | None = None, **fields: Any
    ) -> Created:
        doc = notification(channel, **fields)
        call = _Call("POST", "/v1/notifications", doc, None, _writes(idempotency_key))
        return Created(**(await self._send(call)).json())

    async def notify_many(
        self, items: Sequence[Mapping[str, Any]], *, batch: int = BATCH, in_flight: int = IN_FLIGHT
    ) -> list[ItemResult]:
        """``Client.notify_many``, with ``in_flight`` requests under way on the event loop."""
        gate = asyncio.Semaphore(max(1, in_flight))

        async def placed(start: int, call: _Call) -> list[ItemResult]:
            async with gate:
                answer = await self._send(call)
            return _placed(answer, start)  # read as it comes, while others are sent

        calls = _batches(items, batch)
        answers = await asyncio.gather(
            *(placed(start, call) for start, call in calls), return_exceptions=True
        )
        found = []
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
            found += answer
        return found

    async def get(
        self, id: int | None = None, *, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        path, params = _by(id, idempotency_key)
        result: dict[str, Any] = (await self._send(_Call("GET", path, params=params))).json()
        return result

    async def cancel(self, id: int | None = None, *, idempotency_key: str | None = None) -> bool:
        """True if this cancelled it; False if it had been sent, dead or cancelled already."""
        try:
            await self._send(_cancel_call(id, idempotency_key))
        except Refused as exc:
            if exc.code == "final":
                return False
            raise
        return True

    async def _send(self, call: _Call) -> httpx.Response:
        for attempt in range(self.retries + 1):
            try:
                answer: httpx.Response | httpx.TransportError = await self._http.request(
                    **self._request(call)
                )
            except httpx.TransportError as exc:
                answer = exc
            outcome = self._outcome(answer, attempt)
            if isinstance(outcome, httpx.Response):
                return outcome
            await asyncio.sleep(outcome)
        raise AssertionError("unreachable")  # pragma: no cover

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _cancel_call(id: int | None, idempotency_key: str | None) -> _Call:
    path, _ = _by(id, idempotency_key)
    if id is not None:
        return _Call("POST", f"{path}/cancel")
    return _Call("POST", "/v1/notifications/cancel", {"idempotency_key": idempotency_key})


__all__ = [
    "AsyncClient",
    "Client",
    "Created",
    "ItemResult",
    "NotifierError",
    "Refused",
    "Unavailable",
    "notification",
]
