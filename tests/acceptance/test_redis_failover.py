"""Redis failover under Sentinel, for real: the primary is SIGKILLed in the middle of a drain.

A worker and beat that know Redis only through three Sentinels (``NOTIFIER_REDIS_URL`` points
where nothing listens) drain a backlog of webhooks under a rate limit. The primary is killed.
The test first proves it (the process is gone, its port refuses, the replica calls itself
primary and every Sentinel names it), then that nothing was sent while there was no primary
(fail closed: the rate limits could not be asked), that sending resumed by itself in the same
worker and beat processes, that every row reached the receiver exactly once, and that the
receiver never saw more in any second than the limit allows. It prints one summary line, the
figures docs/redis-failover.md quotes.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator

import pytest
import redis
from sqlalchemy import Engine, text

from tests.acceptance.conftest import Services, unfinished, wait_for
from tests.factories import MakeRows
from tests.receiver import Receiver
from tests.sentinel_servers import MASTER, SentinelServers, role
from tests.server_process import process_gone

pytestmark = pytest.mark.slow

ROWS = 300
#: Sends a second the webhook provider may make, and a window long enough that its bucket's
#: state matters across the failover (it never runs dry here: its burst is the whole limit).
LIMIT, HOURLY = 20, 10_000
#: The default burst of a per-second window of ``LIMIT``: a tenth of a second's worth.
BURST = 2
#: Sends granted before the kill may still arrive this long after it.
IN_FLIGHT = 0.5
#: How much later one send may reach the receiver than another granted at the same moment (its
#: event loop or the receiver's thread held up on a loaded machine): a window at the receiver
#: may hold what the limiter granted over a little more than its length.
ARRIVAL_JITTER = 0.15


def allowed(seconds: float) -> float:
    """What the limiter grants at most in ``seconds`` (a full burst, then its rate), as seen at
    the receiver."""
    return BURST + LIMIT * (seconds + ARRIVAL_JITTER)


@pytest.fixture
def sentinels() -> Iterator[SentinelServers]:
    if shutil.which("redis-sentinel") is None:
        pytest.skip("redis-sentinel is not on PATH (Debian: apt-get install redis-sentinel)")
    servers = SentinelServers().start()
    yield servers
    servers.close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


def most_within(times: list[float], seconds: float) -> int:
    """The most of ``times`` that fall within any window of ``seconds``, wherever it starts."""
    ordered, most, first = sorted(times), 0, 0
    for last, t in enumerate(ordered):
        while t - ordered[first] >= seconds:
            first += 1
        most = max(most, last - first + 1)
    return most


def _by_status(engine: Engine) -> dict[tuple[str, int], int]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT status, attempts, count(*) FROM notifications GROUP BY 1, 2")
        ).all()
    return {(status, attempts): n for status, attempts, n in rows}


def _tokens(port: int, key: str) -> float | None:
    """A rate-limit bucket's tokens as the Redis server on ``port`` holds them."""
    with redis.Redis(port=port, socket_timeout=2) as server:
        tokens = server.hget(key, "tokens")
    return None if tokens is None else float(tokens)


@pytest.mark.timeout(240)
def test_sending_pauses_without_a_primary_and_resumes_on_the_promoted_replica(
    sentinels: SentinelServers,
    engine: Engine,
    make_rows: MakeRows,
    services: Services,
    receiver: Receiver,
) -> None:
    services.env.update(
        NOTIFIER_REDIS_URL="redis://127.0.0.1:1/0",  # nothing listens: only the Sentinels help
        NOTIFIER_REDIS_SENTINELS=sentinels.addresses,
        NOTIFIER_REDIS_SENTINEL_MASTER=MASTER,
        NOTIFIER_RATE_LIMITS=f"webhook={LIMIT}/s,{HOURLY}/h",
        NOTIFIER_WEBHOOK_ALLOW_HTTP="true",
        NOTIFIER_WEBHOOK_ALLOWED_NETWORKS="127.0.0.0/8",
    )
    ids = make_rows(ROWS, channel="webhook", recipient=receiver.url, subject=lambda i: f"n{i}")
    services.worker("w1", concurrency=2)
    services.beat()
    wait_for(lambda: len(services.children("w1")) == 2, 30, "two pool processes")
    worker, pool, beat = services.pid("w1"), services.children("w1"), services.pid("beat")
    wait_for(lambda: len(receiver.deliveries) >= 3 * LIMIT, 60, "the drain to be under way")

    hourly = f"notifier:rate:webhook:{HOURLY}/h"
    held_by_primary = _tokens(sentinels.primary.port, hourly)
    sent_before = len(receiver.deliveries)
    killed_at = time.monotonic()
    primary_pid = sentinels.kill_primary()
    # The fault happened: the primary's process is gone and its port refuses...
    assert process_gone(primary_pid)
    with pytest.raises(redis.ConnectionError), redis.Redis(port=sentinels.primary.port) as gone:
        gone.ping()
    unsent_at_kill = unfinished(engine)
    assert unsent_at_kill > 0, "the drain was over before the primary was killed"
    # ...the replica holds the limiter's state as replicated up to the kill...
    held_by_replica = _tokens(sentinels.replica.port, hourly)
    # ...and it is promoted: it calls itself primary, and every Sentinel names it.
    while role(sentinels.replica.port) != "master":
        assert time.monotonic() - killed_at < 60, "the replica was never promoted"
        time.sleep(0.01)
    promoted_at = time.monotonic()
    # Read before any client can reach it: is the per-second bucket still there? (Its key
    # expires once the bucket would be full again; a missing one starts full.)
    per_second_at_promotion = _tokens(sentinels.replica.port, f"notifier:rate:webhook:{LIMIT}/s")
    wait_for(
        lambda: sentinels.masters() == [sentinels.replica.port] * 3,
        30,
        "every Sentinel to name the replica the primary",
    )
    named_at = time.monotonic()

    wait_for(lambda: _by_status(engine) == {("sent", 1): ROWS}, 120, f"all {ROWS} rows sent")

    arrivals = sorted(arrived for _, arrived, _ in receiver.deliveries)
    in_flight = [t for t in arrivals if killed_at < t <= killed_at + IN_FLIGHT]
    while_down = [t for t in arrivals if killed_at + IN_FLIGHT < t < promoted_at]
    last_before = max(t for t in arrivals if t <= killed_at + IN_FLIGHT)
    first_after = min((t for t in arrivals if t > killed_at + IN_FLIGHT), default=None)
    assert first_after is not None, "nothing was sent after the failover"
    first_second = [t for t in arrivals if first_after <= t < first_after + 1.0]
    log = services.log("w1")
    print(
        f"\n[test_redis_failover] rows={ROWS} limit={LIMIT}/s sent_before_kill={sent_before}"
        f" unsent_at_kill={unsent_at_kill} in_flight_after_kill={len(in_flight)}"
        f" promoted_after={promoted_at - killed_at:.2f}s named_after={named_at - killed_at:.2f}s"
        f" paused={first_after - last_before:.2f}s"
        f" resumed_after_promotion={first_after - promoted_at:.2f}s"
        f" sends_held={round((first_after - last_before) * LIMIT)}"
        f" first_second_after={len(first_second)} most_in_a_second={most_within(arrivals, 1.0)}"
        f" most_in_5s={most_within(arrivals, 5.0)}"
        f" hourly_tokens_primary={held_by_primary} hourly_tokens_replica={held_by_replica}"
        f" per_second_tokens_at_promotion={per_second_at_promotion}"
        f" paused_lines={log.count('sending paused')}"
        f" pool_replaced={services.children('w1') != pool}"
    )

    # Nothing was sent while there was no primary, and the worker said why.
    assert while_down == []
    assert first_after > promoted_at
    assert "sending paused" in log or "Connection to broker lost" in log
    # Sending resumed by itself, in the same worker and beat.
    assert not process_gone(worker)
    assert not process_gone(beat)
    # Every row reached the receiver exactly once, none used a second attempt.
    assert receiver.counts() == {f"notification-{i}": 1 for i in ids}
    # The limiter's state came across: the hour's bucket remembers the sends before the kill
    # (a lost one would have read as full, and granted its whole burst again).
    assert held_by_primary is not None
    assert held_by_replica is not None
    assert held_by_replica <= held_by_primary + 1
    assert held_by_replica < HOURLY - sent_before / 2
    # No second (nor five) at the receiver, before, across or after the failover, held more
    # than the limiter allows: its rate and a burst of a tenth of a second's worth.
    assert most_within(arrivals, 1.0) <= allowed(1.0)
    assert most_within(arrivals, 5.0) <= allowed(5.0)
