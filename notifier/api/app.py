"""``notifier api``: the HTTP API, on Starlette (``docs/api.md``; its document ``openapi.py``).

Routes (every ``/v1/`` route needs ``Authorization: Bearer <key>``):

* ``POST /v1/notifications`` - write one (``Idempotency-Key`` header: at most once)
* ``POST /v1/notifications/batch`` - write up to ``NOTIFIER_API_MAX_BATCH``, each on its own
* ``GET /v1/notifications/{id}``, ``GET /v1/notifications?idempotency_key=K`` - read one of the
  key's own, with its history
* ``POST /v1/notifications/{id}/cancel``, ``POST /v1/notifications/cancel`` (body
  ``{"idempotency_key": K}``) - cancel one of the key's own that is not final
* ``GET /openapi.json`` - the document; ``GET /health`` - alive; ``GET /ready`` - the database
  and Redis answer

Every answer is JSON. A refusal is a 4xx with ``{"error": {"code", "message", "field"}}``; a
database or Redis that does not answer, 503 with ``Retry-After``; nothing else is a 5xx. Each
request is logged as one line (method, route, status, milliseconds, the key's prefix): never
a key, a body, a query string or an address.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from notifier.api import bodies, openapi
from notifier.api.bodies import ApiError
from notifier.api.people import People
from notifier.api.service import Service
from notifier.db.api import KeyRow
from notifier.settings import Settings

log = logging.getLogger("notifier.api")


@dataclass(frozen=True, slots=True)
class Asked:
    """What a request asks, read on the event loop; served in one trip to a thread."""

    method: str
    row_id: int | None
    #: a profile's id or a campaign's name, as the path gives it
    name: str | None
    query: dict[str, str]
    idempotency_key: str | None
    content_type: str
    body: bytes | None


#: A batch's answer closes its connection: the client's next batch is accepted anew, by
#: whichever of the API's processes gets to it first, the least busy as a rule. Kept open, a
#: client's few connections stay where they were accepted, often all in one process (all four
#: of the SDK's ``notify_many``, in 3 of 11 starts of the API in one set of runs, the other
#: process idle), as the processes share one listening socket. A batch costs far more than a
#: new connection.
BALANCED = {"Connection": "close"}

#: An operation: the key's request answered, in a worker thread.
Action = Callable[[KeyRow, Asked], Response]
#: A write answered on the connection its key was read on (in autocommit: ``Service.create``).
Write = Callable[[Connection, KeyRow, Asked], Response]


def create_app(
    settings: Settings,
    engine: Engine,
    counter: redis.Redis | None,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> Starlette:
    service = Service(settings, engine, counter, clock)
    people = People(engine)
    document = openapi.document()
    limit = settings.api_max_body_bytes

    async def body_of(request: Request) -> bytes:
        """The body, refused (413) past the limit before more of it is read."""
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            raise ApiError(413, "too_large", f"the body is over {limit} bytes")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, "too_large", f"the body is over {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def keyed(
        action: Action, write: Write | None = None
    ) -> Callable[[Request], Awaitable[Response]]:
        """The route's endpoint: the key checked, counted and served in one thread hop (each
        hop waits for the GIL, which many threads under load share). A POST the route has a
        ``write`` for is served on the connection its key is read on."""

        async def endpoint(request: Request) -> Response:
            # a key in a key's form first: without one, no body is read, no database asked
            presented = service.presented(request.headers.get("authorization"))
            asked = Asked(
                method=request.method,
                row_id=_row_id(request),
                name=request.path_params.get("name"),
                query=dict(request.query_params),
                idempotency_key=request.headers.get("idempotency-key"),
                content_type=request.headers.get("content-type", ""),
                body=await body_of(request) if request.method in ("POST", "PUT") else None,
            )
            state = request.state

            def admitted(conn: Connection | None = None) -> KeyRow:
                key = service.authenticate(presented, conn)
                state.key_prefix = key.prefix
                service.admit(key)
                return key

            def serve() -> Response:
                if write is not None and asked.method == "POST":
                    with service.autocommit.connect() as conn:
                        return write(conn, admitted(conn), asked)
                return action(admitted(), asked)

            return await run_in_threadpool(serve)

        return endpoint

    def create(conn: Connection, key: KeyRow, asked: Asked) -> Response:
        idem = bodies.idempotency_key(asked.idempotency_key)
        made = service.create(conn, key, _json(asked), idem)
        headers = {"Idempotent-Replayed": "true"} if made.replayed else {}
        return JSONResponse(made.document(), status_code=201, headers=headers)

    def create_many(key: KeyRow, asked: Asked) -> Response:
        results = service.create_many(key, _json(asked))
        return JSONResponse({"results": results}, headers=BALANCED)

    def read(key: KeyRow, asked: Asked) -> Response:
        if asked.row_id is not None:
            return JSONResponse(service.read(key, row_id=asked.row_id))
        if set(asked.query) != {"idempotency_key"}:
            raise ApiError(
                400,
                "invalid_query",
                "read one notification: /v1/notifications/{id} or ?idempotency_key=K",
                "idempotency_key",
            )
        idem = bodies.idempotency_key(asked.query["idempotency_key"], "idempotency_key")
        return JSONResponse(service.read(key, idem=idem))

    def cancel(key: KeyRow, asked: Asked) -> Response:
        if asked.row_id is not None:
            return JSONResponse(service.cancel(key, row_id=asked.row_id))
        doc = _json(asked)
        given = doc.get("idempotency_key") if isinstance(doc, dict) else None
        if not isinstance(doc, dict) or set(doc) != {"idempotency_key"} or not given:
            raise ApiError(
                422, "invalid_body", 'send {"idempotency_key": "..."}', "idempotency_key"
            )
        idem = bodies.idempotency_key(str(given), "idempotency_key")
        return JSONResponse(service.cancel(key, idem=idem))

    def profile(key: KeyRow, asked: Asked) -> Response:
        if asked.method == "PUT":
            return JSONResponse(people.upsert(key, asked.name or "", _json(asked)))
        return JSONResponse(people.read(asked.name or ""))

    def preferences(key: KeyRow, asked: Asked) -> Response:
        return JSONResponse(people.prefer(key, asked.name or "", _json(asked)))

    def campaign(key: KeyRow, asked: Asked) -> Response:
        return JSONResponse(people.campaign(asked.name or ""))

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready(request: Request) -> Response:
        await run_in_threadpool(service.ready)
        return JSONResponse({"status": "ready"})

    async def served_document(request: Request) -> Response:
        return JSONResponse(document)

    routes = [
        # one route per path, so that a 405 lists every method the path has in its Allow
        Route("/v1/notifications", keyed(read, create), methods=["GET", "POST"]),
        Route("/v1/notifications/batch", keyed(create_many), methods=["POST"]),
        Route("/v1/notifications/cancel", keyed(cancel), methods=["POST"]),
        Route("/v1/notifications/{id:int}", keyed(read), methods=["GET"]),
        Route("/v1/notifications/{id:int}/cancel", keyed(cancel), methods=["POST"]),
        Route("/v1/profiles/{name}", keyed(profile), methods=["GET", "PUT"]),
        Route("/v1/profiles/{name}/preferences", keyed(preferences), methods=["PUT"]),
        Route("/v1/campaigns/{name}", keyed(campaign), methods=["GET"]),
        Route("/openapi.json", served_document, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _no_route})
    app.add_middleware(_Guard)
    return app


async def _no_route(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 404
    code = {404: "not_found", 405: "method_not_allowed"}.get(status, "refused")
    refused = ApiError(status, code, f"no such route: see /openapi.json ({status})")
    headers = exc.headers if isinstance(exc, HTTPException) else None  # 405's Allow
    return JSONResponse(refused.document(), status_code=status, headers=headers)


def _json(asked: Asked) -> Any:
    """The request's body as JSON (``bodies.read_json``), if it says it is JSON."""
    if asked.content_type.split(";")[0].strip() != "application/json":
        raise ApiError(415, "unsupported_media_type", "send the body as application/json")
    return bodies.read_json(asked.body or b"")


def _row_id(request: Request) -> int | None:
    found = request.path_params.get("id")
    if found is None:
        return None
    if not isinstance(found, int) or not 0 < found < 2**63:
        raise ApiError(404, "not_found", "this key wrote no such notification", "id")
    return found


class _Guard:
    """Turns refusals and outages into their JSON answers, answers what no route takes with a
    JSON 404 or 405, and logs each request as one line without anything secret."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        status: list[int] = []

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                status.append(int(message["status"]))
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except ApiError as exc:
            await _answer(exc, scope, receive, sending)
        except (SQLAlchemyError, redis.RedisError) as exc:
            log.warning("could not answer %s %s: %s", scope["method"], _route(scope), exc)
            outage = ApiError(503, "unavailable", "try again in a moment", retry_after=5)
            await _answer(outage, scope, receive, sending)
        except Exception:
            log.exception("answering %s %s raised", scope["method"], _route(scope))
            if not status:
                broken = ApiError(503, "unavailable", "try again in a moment", retry_after=5)
                await _answer(broken, scope, receive, sending)
        log.info(
            "%s %s %s %.1fms",
            scope["method"],
            _route(scope),
            status[0] if status else 0,
            (time.monotonic() - started) * 1000,
            extra={
                "event": "request",
                "method": scope["method"],
                "route": _route(scope),
                "status": status[0] if status else 0,
                "key": scope.get("state", {}).get("key_prefix"),
            },
        )


async def _answer(exc: ApiError, scope: Any, receive: Any, send: Any) -> None:
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else {}
    response = JSONResponse(exc.document(), status_code=exc.status, headers=headers)
    await response(scope, receive, send)


def _route(scope: Any) -> str:
    """The route's template (``/v1/notifications/{id}``), never the path as sent."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "(no route)"
