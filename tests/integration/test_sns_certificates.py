"""The SNS certificate cache against a real HTTP server serving certificates: each URL fetched
once however many requests need it at once, failures remembered briefly, and only a bounded
number of certificates kept."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from notifier.events.model import Refused
from notifier.events.sns import Certificates, fetch_key
from tests.events_endpoint import CertServer, _Handler, _self_signed


@pytest.fixture
def certs() -> Iterator[CertServer]:
    server = CertServer(("127.0.0.1", 0), _Handler)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    server.pem, server.confirmed, server.fetches = _self_signed(key), [], []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def base(server: CertServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_concurrent_first_requests_wait_for_one_fetch(certs: CertServer) -> None:
    certs.delay = 0.3
    cache = Certificates(fetch_key)
    with ThreadPoolExecutor(24) as pool:
        keys = list(pool.map(lambda _: cache.key(base(certs) + "/cert.pem"), range(24)))
    assert len({k.public_numbers() for k in keys}) == 1
    assert certs.fetches == ["/cert.pem"]


def test_a_failure_is_answered_from_memory_then_tried_again(certs: CertServer) -> None:
    clock = Clock()
    cache = Certificates(fetch_key, retry_after=10, clock=clock)
    url = base(certs) + "/missing.pem"
    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(lambda _: _refused(cache, url), range(40)))
    assert set(outcomes) == {403}
    assert certs.fetches == ["/missing.pem"]
    clock.now += 9.9
    assert _refused(cache, url) == 403
    assert certs.fetches == ["/missing.pem"]
    clock.now += 0.2  # no longer remembered: tried again
    assert _refused(cache, url) == 403
    assert certs.fetches == ["/missing.pem", "/missing.pem"]


def test_only_the_most_recently_used_certificates_are_kept(certs: CertServer) -> None:
    cache = Certificates(lambda url: fetch_key(base(certs) + "/cert.pem"), size=3)
    for name in ["a", "b", "c", "a", "d"]:  # "b" is the least recently used when "d" comes
        cache.key(name)
    assert len(certs.fetches) == 4
    for name in ["a", "c", "d"]:
        cache.key(name)
    assert len(certs.fetches) == 4
    cache.key("b")
    assert len(certs.fetches) == 5
    failing = Certificates(lambda url: fetch_key(base(certs) + f"/{url}.pem"), size=3)
    for n in range(100):  # attacker-chosen URLs that fail: remembered, but only a few
        assert _refused(failing, f"x{n}") == 403
    assert len(failing._failed) == 3


def _refused(cache: Certificates, url: str) -> int | None:
    try:
        cache.key(url)
    except Refused as exc:
        return exc.status
    return None
