"""Naming Redis by Sentinels: what the settings accept and refuse, and the clients made of them.

No server is reached: a client connects on its first command. The failover itself is
tests/acceptance/test_redis_failover.py.
"""

from __future__ import annotations

import pytest
from redis.sentinel import SentinelConnectionPool

from notifier import redis_access
from notifier.settings import Settings, SettingsError, get_settings
from notifier.specs import Address, parse_sentinels
from tests.factories import SetEnv

SENTINELS = "sentinel-1:26379,10.0.0.7:26380,[fd00::7]"


def test_sentinels_are_read_in_order_with_sentinels_port_by_default() -> None:
    assert parse_sentinels(SENTINELS) == [
        Address("sentinel-1", 26379),
        Address("10.0.0.7", 26380),
        Address("fd00::7", 26379),
    ]
    assert parse_sentinels(" ") == []
    assert str(Address("fd00::7", 26379)) == "[fd00::7]:26379"


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("s1:26379,s2:port", "'s2:port' has a port that is not a number"),
        ("s1:0", "'s1:0' has a port outside 1 to 65535"),
        ("redis://s1:26379", "'redis://s1:26379' names a scheme"),
        ("s1 s2", "'s1 s2' is not a host name or address"),
        ("s1,S1:26379", "'S1:26379' is listed twice"),
    ],
)
def test_a_malformed_sentinel_is_named_with_the_fix(set_env: SetEnv, value: str, says: str) -> None:
    set_env(redis_sentinels=value, redis_sentinel_master="mymaster")
    with pytest.raises(SettingsError) as refused:
        get_settings()
    assert str(refused.value) == (
        f"NOTIFIER_REDIS_SENTINELS: {says}; write host:port separated by commas,"
        " e.g. sentinel-1:26379,sentinel-2:26379,sentinel-3:26379"
    )


def test_sentinels_need_the_masters_name(set_env: SetEnv) -> None:
    set_env(redis_sentinels=SENTINELS)
    with pytest.raises(SettingsError) as refused:
        get_settings()
    assert str(refused.value) == (
        "NOTIFIER_REDIS_SENTINEL_MASTER: needed with NOTIFIER_REDIS_SENTINELS: set it to the"
        " name of the Sentinels' 'sentinel monitor NAME ...' line, e.g. mymaster"
    )


def test_a_masters_name_needs_sentinels(set_env: SetEnv) -> None:
    set_env(redis_sentinel_master="mymaster")
    with pytest.raises(SettingsError) as refused:
        get_settings()
    assert str(refused.value).startswith(
        "NOTIFIER_REDIS_SENTINEL_MASTER: has no Sentinels to ask: set NOTIFIER_REDIS_SENTINELS"
    )


def test_a_masters_name_is_one_sentinel_accepts(set_env: SetEnv) -> None:
    set_env(redis_sentinels=SENTINELS, redis_sentinel_master="my master")
    with pytest.raises(SettingsError) as refused:
        get_settings()
    assert str(refused.value).startswith(
        "NOTIFIER_REDIS_SENTINEL_MASTER: 'my master' is not a master name"
    )


def _sentinel_settings(password: str | None = None, db: int = 0) -> Settings:
    return Settings(
        redis_sentinels=SENTINELS,  # read from text, as from the environment
        redis_sentinel_master="mymaster",
        redis_sentinel_password=password,
        redis_sentinel_db=db,
    )


def test_without_sentinels_everything_uses_the_url() -> None:
    settings = Settings(redis_url="redis://cache:6380/3")
    assert redis_access.celery_broker(settings) == ("redis://cache:6380/3", {})
    client = redis_access.client(settings, timeout=2)
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("cache", 6380, 3)
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (2, 2)
    assert redis_access.named_by(settings) == "NOTIFIER_REDIS_URL"


def test_with_sentinels_the_broker_asks_every_one_for_the_master() -> None:
    url, options = redis_access.celery_broker(_sentinel_settings(password="p@ss/word", db=2))
    assert url == (
        "sentinel://:p%40ss%2Fword@sentinel-1:26379/2;sentinel://:p%40ss%2Fword@10.0.0.7:26380/2"
        ";sentinel://:p%40ss%2Fword@[fd00::7]:26379/2"
    )
    assert options == {"master_name": "mymaster"}
    assert redis_access.celery_broker(_sentinel_settings())[0].startswith(
        "sentinel://sentinel-1:26379/0;"
    )


def test_with_sentinels_a_client_follows_the_primary_they_name() -> None:
    settings = _sentinel_settings(password="secret", db=2)
    client = redis_access.client(settings, timeout=5)
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    assert pool.service_name == "mymaster"
    assert pool.is_master
    kwargs = pool.connection_kwargs
    assert (kwargs["password"], kwargs["db"], kwargs["socket_timeout"]) == ("secret", 2, 5)
    sentinels = pool.sentinel_manager.sentinels
    assert [s.connection_pool.connection_kwargs["port"] for s in sentinels] == [26379, 26380, 26379]
    for sentinel in sentinels:  # asked briefly, and without the primary's password
        kwargs = sentinel.connection_pool.connection_kwargs
        assert kwargs["socket_timeout"] == redis_access.SENTINEL_TIMEOUT
        assert kwargs.get("password") is None
    assert redis_access.named_by(settings) == "NOTIFIER_REDIS_SENTINELS, master mymaster"
