"""How every part of notifier reaches Redis: the one server ``NOTIFIER_REDIS_URL`` names, or the
current primary that Redis Sentinels name (``NOTIFIER_REDIS_SENTINELS``), followed through a
failover.

``client()`` is the one way a process makes its Redis client (the worker, ``notifier api``,
``events``, ``metrics`` and ``health``), and ``celery_broker()`` points Celery's broker at the
same Redis, so that no part stays behind on a primary the others have left.

Under Sentinel a client asks the Sentinels where the primary is whenever it (re)connects. While
they name none (the primary is down and no replica promoted yet) every command raises a
``redis.ConnectionError``, as an unreachable Redis does: the dispatcher's gate and its rate
limiter turn that into a pause, so nothing is sent (fail closed). The first command after the
promotion reaches the new primary; a connection still open to a primary since demoted gets
``READONLY``, which redis-py turns into a reconnection. See docs/redis-failover.md.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import redis
from redis.sentinel import Sentinel

from notifier.settings import Settings

#: Seconds a Sentinel may take to answer before the next one is asked. Sentinels answer from
#: memory: one that says nothing for this long is as good as gone, and a client that waited
#: the full ``timeout`` for each of three would hold a send gate that long.
SENTINEL_TIMEOUT = 1.0


def client(settings: Settings, *, timeout: float = 5.0) -> redis.Redis:
    """A Redis client of the current primary; ``timeout`` bounds each connection and reply.

    Nothing connects until the first command, so this never fails for want of Redis."""
    if not settings.redis_sentinels:
        return redis.Redis.from_url(
            settings.redis_url, socket_timeout=timeout, socket_connect_timeout=timeout
        )
    asked = min(timeout, SENTINEL_TIMEOUT)
    # redis.sentinel has no annotations: its two calls are taken on trust.
    sentinels = Sentinel(  # type: ignore[no-untyped-call]
        [(a.host, a.port) for a in settings.redis_sentinels],
        sentinel_kwargs={"socket_timeout": asked, "socket_connect_timeout": asked},
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        password=settings.redis_sentinel_password,
        db=settings.redis_sentinel_db,
    )
    assert settings.redis_sentinel_master is not None  # the settings refuse Sentinels without
    primary: redis.Redis = sentinels.master_for(  # type: ignore[no-untyped-call]
        settings.redis_sentinel_master
    )
    return primary


def celery_broker(settings: Settings) -> tuple[str, dict[str, Any]]:
    """Celery's ``broker_url``, and what its ``broker_transport_options`` need beside it.

    With Sentinels, kombu's ``sentinel://`` transport: one URL per Sentinel, joined by ``;``
    (kombu asks them all, whichever it is connected through), each carrying the primary's
    password and database, with the master's name as the transport option ``master_name``."""
    if not settings.redis_sentinels:
        return settings.redis_url, {}
    password = settings.redis_sentinel_password
    auth = f":{quote(password, safe='')}@" if password else ""
    url = ";".join(
        f"sentinel://{auth}{address}/{settings.redis_sentinel_db}"
        for address in settings.redis_sentinels
    )
    return url, {"master_name": settings.redis_sentinel_master}


def named_by(settings: Settings) -> str:
    """The settings that say where Redis is, for a line saying it cannot be reached."""
    if settings.redis_sentinels:
        return f"NOTIFIER_REDIS_SENTINELS, master {settings.redis_sentinel_master}"
    return "NOTIFIER_REDIS_URL"
