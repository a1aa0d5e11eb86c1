"""The webhook address rule, pure: which addresses are internal, what the operator may allow.

No traffic: ``resolve`` is only given numeric hosts, which the resolver reads without a query,
and the sockets the socket factory makes are never connected.
"""

from __future__ import annotations

import asyncio
import socket
from ipaddress import ip_address, ip_network

import pytest
from pydantic import ValidationError

from notifier.providers.netguard import (
    AddressPolicy,
    BlockedAddress,
    GuardedResolver,
    forbidden,
    guarded_socket,
    legacy_ipv4,
)
from notifier.settings import Settings
from tests.factories import SetEnv

CLASSIFIED = [
    # address, kind (None: public), written as
    ("127.0.0.1", "loopback", None),
    ("127.255.255.254", "loopback", None),
    ("10.1.2.3", "private", None),
    ("172.16.0.1", "private", None),
    ("172.31.255.255", "private", None),
    ("192.168.1.1", "private", None),
    ("169.254.169.254", "link-local", None),
    ("0.0.0.0", "unspecified", None),
    ("100.64.0.1", "shared (carrier-grade NAT)", None),
    ("224.0.0.251", "multicast", None),
    ("255.255.255.255", "reserved", None),
    ("192.0.2.1", "reserved", None),
    ("198.18.0.1", "reserved", None),
    ("::1", "loopback", None),
    ("::", "unspecified", None),
    ("fe80::1", "link-local", None),
    ("fe80::1%eth0", "link-local", None),
    ("fc00::1", "private", None),
    ("fd12:3456::1", "private", None),
    ("fec0::1", "private", None),
    ("ff02::1", "multicast", None),
    ("2001:db8::1", "reserved", None),
    ("::127.0.0.1", "reserved", None),  # the deprecated IPv4-compatible form
    ("::ffff:127.0.0.1", "loopback", "IPv4-mapped"),
    ("::ffff:169.254.169.254", "link-local", "IPv4-mapped"),
    ("::ffff:10.0.0.1", "private", "IPv4-mapped"),
    ("64:ff9b::a00:1", "private", "NAT64"),
    ("2002:7f00:1::1", "loopback", "6to4"),
    # public
    ("8.8.8.8", None, None),
    ("1.1.1.1", None, None),
    ("172.32.0.1", None, None),
    ("100.128.0.1", None, None),
    ("2606:4700:4700::1111", None, None),
    ("2001:4860:4860::8888", None, None),
    ("::ffff:8.8.8.8", None, None),
    ("2002:808:808::1", None, None),
]


@pytest.mark.parametrize(("address", "kind", "via"), CLASSIFIED, ids=[c[0] for c in CLASSIFIED])
def test_addresses_are_classified(address: str, kind: str | None, via: str | None) -> None:
    found = forbidden(ip_address(address))
    if kind is None:
        assert found is None
    else:
        assert found is not None
        assert (found.kind, found.via) == (kind, via)


def test_the_reason_names_target_address_kind_and_the_way_out() -> None:
    policy = AddressPolicy()
    assert policy.check_literal("169.254.169.254") == (
        "webhook target 169.254.169.254 is a link-local address (in 169.254.0.0/16); notifier "
        "does not call internal networks. Use a public URL, or have the operator allow that "
        "network with NOTIFIER_WEBHOOK_ALLOWED_NETWORKS"
    )
    reason = policy.refusal("hooks.internal", ip_address("::ffff:10.0.0.7"))
    assert reason is not None
    assert reason.startswith(
        "webhook target hooks.internal resolves to ::ffff:a00:7, "
        "an IPv4-mapped private address (in 10.0.0.0/8);"
    )
    assert policy.check_literal("hooks.example.com") is None  # a name: for resolve() to judge
    assert policy.check_literal("8.8.8.8") is None


@pytest.mark.parametrize(
    ("allowed", "address", "refused"),
    [
        ("10.0.0.0/8", "10.20.30.40", False),
        ("10.0.0.0/8", "192.168.0.1", True),
        ("127.0.0.0/8", "::ffff:127.0.0.1", False),  # mapped: allowed by its IPv4 network
        ("127.0.0.0/8", "::1", True),
        ("::1/128", "::1", False),
        ("fd00:1::/64", "fd00:1::5", False),
        ("fd00:1::/64", "fd00:2::5", True),
        ("", "8.8.8.8", False),  # public needs no permission
    ],
)
def test_allowed_networks_are_exceptions(allowed: str, address: str, refused: bool) -> None:
    networks = [ip_network(n) for n in allowed.split(",") if n]
    reason = AddressPolicy(networks).refusal(address, ip_address(address))
    assert (reason is not None) is refused


@pytest.mark.parametrize(
    ("host", "resolved"),
    [("127.1", "127.0.0.1"), ("2130706433", "127.0.0.1"), ("0x7f.0.0.1", "127.0.0.1")],
)
def test_resolve_judges_what_the_resolver_makes_of_a_host(host: str, resolved: str) -> None:
    with pytest.raises(BlockedAddress, match=f"{host} resolves to {resolved}, a loopback"):
        AddressPolicy().resolve(host, 443)
    assert AddressPolicy([ip_network("127.0.0.0/8")]).resolve(host, 443) == [resolved]


def test_resolve_returns_public_addresses() -> None:
    assert AddressPolicy().resolve("8.8.8.8", 443) == ["8.8.8.8"]


# -- NOTIFIER_WEBHOOK_ALLOWED_NETWORKS -----------------------------------------------------------


def test_allowed_networks_are_read_from_a_comma_separated_list(set_env: SetEnv) -> None:
    set_env(webhook_allowed_networks=None)
    assert Settings().webhook_allowed_networks == []
    set_env(webhook_allowed_networks=" 10.20.0.0/16, fd00:1::/64,,10.9.9.9")
    assert Settings().webhook_allowed_networks == [
        ip_network("10.20.0.0/16"),
        ip_network("fd00:1::/64"),
        ip_network("10.9.9.9/32"),
    ]
    set_env(webhook_allowed_networks="")
    assert Settings().webhook_allowed_networks == []


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("10.0.0.1/8", "'10.0.0.1/8' is not a network in CIDR notation like 10.0.0.0/8"),
        ("10.0.0.0/8,intranet", "'intranet' is not a network in CIDR notation"),
        ('["10.0.0.0/8"]', "is not a network in CIDR notation"),
    ],
)
def test_a_bad_network_is_a_clear_settings_error(set_env: SetEnv, value: str, says: str) -> None:
    set_env(webhook_allowed_networks=value)
    with pytest.raises(ValidationError, match="webhook_allowed_networks") as error:
        Settings()
    assert says in str(error.value)


def _addr_info(host: str) -> tuple[int, int, int, str, tuple[str, int]]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (host, 443)


def test_the_socket_factory_checks_the_very_address_it_connects_to() -> None:
    """The last check, whatever the URL's host was: it sees the address about to be used."""
    make = guarded_socket(AddressPolicy([ip_network("10.0.0.0/8")]))
    with pytest.raises(BlockedAddress, match=r"webhook target 127\.0\.0\.1 is a loopback address"):
        make(_addr_info("127.0.0.1"))
    with pytest.raises(BlockedAddress, match="IPv4-mapped loopback"):
        make(_addr_info("::ffff:127.0.0.1"))
    with pytest.raises(BlockedAddress, match="was not resolved through the address check"):
        make(_addr_info("localhost"))
    with make(_addr_info("10.1.2.3")) as allowed:
        assert allowed.family == socket.AF_INET


def test_the_resolver_hands_the_client_only_checked_addresses() -> None:
    allowed = GuardedResolver(AddressPolicy([ip_network("127.0.0.0/8")]))
    [result] = asyncio.run(allowed.resolve("127.0.0.1", 8443))
    assert (result["hostname"], result["host"], result["port"]) == ("127.0.0.1", "127.0.0.1", 8443)
    assert result["family"] == socket.AF_INET
    with pytest.raises(BlockedAddress, match="is a loopback address"):
        asyncio.run(GuardedResolver(AddressPolicy()).resolve("127.0.0.1", 8443))


@pytest.mark.parametrize(
    ("host", "legacy"),
    [("127.1", True), ("2130706433", True), ("127.0.0.1.", True), ("127.0.0.1", False),
     ("0x7f.1", False), ("example.com", False), ("::1", False)],
)  # fmt: skip
def test_legacy_numeric_ipv4_forms(host: str, legacy: bool) -> None:
    assert legacy_ipv4(host) is legacy
