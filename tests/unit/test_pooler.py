"""Behind a transaction pooler: the settings that say so, and the connection budget's verdicts
against the pooler's limits and PostgreSQL's (docs/pgbouncer.md), without a database."""

from __future__ import annotations

import pytest

from notifier.db.pooler import PoolerLimits
from notifier.db.workers import ConnectionLimits
from notifier.settings import Settings, SettingsError, get_settings
from notifier.worker.budget import Budget, pooled_verdict, verdict
from tests.factories import SetEnv

POSTGRES = ConnectionLimits(max_connections=100, reserved=3, in_use=10)
#: docs/pgbouncer.md's PgBouncer: 400 clients, 20 + 5 server connections for notifier's database.
PGBOUNCER = PoolerLimits(
    database="notifier",
    max_client_conn=400,
    pool_size=20,
    reserve_pool=5,
    max_db_connections=0,
    pools=1,
    pool_mode="transaction",
)
#: Ten worker hosts of 4 processes each, one more during a rolling restart.
TEN_HOSTS = Budget(concurrency=4, replicas=11)


def test_a_transaction_pooler_needs_a_session_url_beside_it(set_env: SetEnv) -> None:
    set_env(database_pooler="transaction")
    with pytest.raises(SettingsError) as refused:
        get_settings()
    assert str(refused.value).startswith(
        "NOTIFIER_DATABASE_SESSION_URL: needed with NOTIFIER_DATABASE_POOLER=transaction"
    )


def test_the_session_url_defaults_to_the_database_url_and_is_spelled_like_it() -> None:
    plain = Settings(database_url="postgresql://app@db/notifier")
    assert plain.session_database_url == "postgresql+psycopg://app@db/notifier"
    assert not plain.transaction_pooled
    pooled = Settings(
        database_url="postgresql://app@pgbouncer:6432/notifier",
        database_pooler="transaction",
        database_session_url="postgres://app@db:5432/notifier",
    )
    assert pooled.transaction_pooled
    assert pooled.session_database_url == "postgresql+psycopg://app@db:5432/notifier"


def test_ten_hosts_that_postgresql_alone_cannot_hold_fit_behind_pgbouncer() -> None:
    assert TEN_HOSTS.needed == 11 * (4 * 5 + 2) + 7 == 249
    assert (verdict(TEN_HOSTS, POSTGRES) or ("",))[0] == "fail"
    assert TEN_HOSTS.pooled_needed == 11 * (4 * 5 + 1) + 7 == 238
    assert TEN_HOSTS.sessions_needed == 11 + 3
    assert PGBOUNCER.server_connections == 25
    assert pooled_verdict(TEN_HOSTS, PGBOUNCER, POSTGRES) is None  # 238 of 400; 39 of 97


def test_too_many_clients_for_pgbouncer_fail_naming_max_client_conn() -> None:
    small = PoolerLimits("notifier", 200, 20, 5, 0, 1, "transaction")
    level, line = pooled_verdict(TEN_HOSTS, small, POSTGRES) or ("", "")
    assert level == "fail"
    assert line == (
        "notifier needs 238 client connections to PgBouncer (11 worker(s) x (4 processes x 5"
        " + 1) + 7 for metrics and commands), its max_client_conn is 200: raise"
        " max_client_conn in pgbouncer.ini, or lower --concurrency or NOTIFIER_EXPECTED_WORKERS"
    )
    level, line = pooled_verdict(
        TEN_HOSTS, PoolerLimits("notifier", 280, 20, 5, 0, 1, "transaction"), POSTGRES
    ) or ("", "")
    assert level == "warn"
    assert line.startswith("notifier may need 238 of the 280 client connections PgBouncer allows")


def test_a_pool_postgresql_cannot_hold_fails_naming_the_pool_size() -> None:
    # Two logins (a pool each) of 40 + 10: 100 server connections, and 14 sessions beside them.
    big = PoolerLimits("notifier", 400, 40, 10, 0, 2, "transaction")
    level, line = pooled_verdict(TEN_HOSTS, big, POSTGRES) or ("", "")
    assert level == "fail"
    assert line == (
        "PgBouncer may open 100 server connections to notifier ((pool_size 40 + reserve_pool"
        " 10) x 2 pool(s)) and notifier 14 sessions beside it (11 worker(s) x 1 LISTEN + 3 for"
        " launches, migrate and operators): 114 in all, PostgreSQL allows 97 (max_connections"
        " 100 - 3 reserved): lower PgBouncer's pool_size for notifier (or default_pool_size,"
        " reserve_pool_size, max_db_connections), or raise PostgreSQL's max_connections"
    )
    capped = PoolerLimits("notifier", 400, 40, 10, 70, 2, "transaction")
    assert capped.server_connections == 70
    level, line = pooled_verdict(TEN_HOSTS, capped, POSTGRES) or ("", "")
    assert level == "warn"  # 84 of 97
    assert "(max_db_connections 70)" in line


def test_a_session_pool_mode_warns_and_an_unreadable_pooler_checks_the_sessions_only() -> None:
    session = PoolerLimits("notifier", 400, 20, 5, 0, 1, "session")
    level, line = pooled_verdict(TEN_HOSTS, session, POSTGRES) or ("", "")
    assert level == "warn"
    assert "pool_mode for notifier is session" in line
    assert pooled_verdict(TEN_HOSTS, None, POSTGRES) is None
    crowd = Budget(concurrency=4, replicas=95)
    level, line = pooled_verdict(crowd, None, POSTGRES) or ("", "")
    assert level == "fail"
    assert line.startswith("notifier needs 98 sessions beside PgBouncer (95 worker(s) x 1 LISTEN")
