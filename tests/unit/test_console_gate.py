"""The console's gate: which hosts and origins are its own, who the client is, and paths
built from names."""

from __future__ import annotations

from ipaddress import ip_network
from urllib.parse import quote, unquote, urljoin, urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.routing import Match

from notifier.console import actions, exports, pages
from notifier.console.app import Segment, segment
from notifier.console.gate import Gate, route_path
from notifier.settings import SettingsError, get_settings
from notifier.specs import HostPattern, parse_hosts
from tests.factories import SetEnv

GATE = Gate.loopback(8090)
DOTS = (".", "..")


@pytest.mark.parametrize(
    ("host", "ok"),
    [
        ("127.0.0.1:8090", True),
        ("localhost:8090", True),
        ("LOCALHOST:8090", True),
        ("[::1]:8090", True),
        ("127.0.0.1", False),  # port 80
        ("127.0.0.1:8091", False),
        ("evil.example:8090", False),
        ("localhost.:8090", False),
        ("127.0.0.1:8090@evil.example", False),
        ("localhost:08090x", False),
        ("", False),
        ("[::1", False),
    ],
)
def test_the_default_hosts_are_loopback_on_the_port(host: str, ok: bool) -> None:
    assert GATE.host_ok([(b"host", host.encode())], "http") is ok


def test_one_host_header_exactly() -> None:
    assert not GATE.host_ok([], "http")
    two = [(b"host", b"127.0.0.1:8090"), (b"host", b"evil.example")]
    assert not GATE.host_ok(two, "http")
    assert not GATE.host_ok([(b"host", "lócalhost:8090".encode())], "http")


def test_patterns_name_a_port_or_any_and_subdomains() -> None:
    gate = Gate(tuple(parse_hosts("console.example.com, *.ops.example.com, 10.0.0.5:8443")))
    assert gate.allows("console.example.com", "https")
    assert gate.allows("console.example.com:9999", "http")
    assert gate.allows("a.ops.example.com", "https")
    assert not gate.allows("ops.example.com", "https")
    assert not gate.allows("evilops.example.com", "https")
    assert gate.allows("10.0.0.5:8443", "http")
    assert not gate.allows("10.0.0.5", "https")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("console example", "'console example' is not a host name"),
        ("a:99999", "outside 1 to 65535"),
        ("a:x", "port that is not a number"),
        ("[::g]", "not an IPv6 address"),
        ("http://a", r"write host\[:port\]"),
    ],
)
def test_a_bad_host_list_is_refused_naming_the_entry(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_hosts(spec)


def test_parse_hosts_reads_the_forms() -> None:
    assert parse_hosts(" A.example:81 ,[::1],*.b.example") == [
        HostPattern("a.example", 81),
        HostPattern("[::1]", None),
        HostPattern("*.b.example", None),
    ]


@pytest.mark.parametrize(
    ("origin", "scheme", "ok"),
    [
        (None, "http", True),
        ("http://127.0.0.1:8090", "http", True),
        ("http://localhost:8090", "http", True),
        ("null", "http", False),
        ("", "http", False),
        ("https://127.0.0.1:8090", "http", False),
        ("http://127.0.0.1:8090", "https", False),
        ("http://127.0.0.1", "http", False),
        ("http://evil.example:8090", "http", False),
        ("http://127.0.0.1:8090/", "http", False),
        ("http://user@127.0.0.1:8090", "http", False),
        ("http://127.0.0.1:8090.evil.example", "http", False),
    ],
)
def test_an_origin_is_scheme_host_and_port(origin: str | None, scheme: str, ok: bool) -> None:
    assert GATE.origin_ok(origin, scheme) is ok


def test_behind_a_tls_proxy_the_origin_is_https_on_443() -> None:
    gate = Gate(tuple(parse_hosts("console.example.com")), "https")
    _, scheme = gate.front("127.0.0.1", [])
    assert scheme == "https"
    assert gate.origin_ok("https://console.example.com", scheme)
    assert gate.origin_ok("https://console.example.com:443", scheme)
    assert not gate.origin_ok("http://console.example.com", scheme)


def test_forwarded_headers_count_from_a_trusted_proxy_only() -> None:
    headers = [(b"x-forwarded-for", b"198.51.100.1, 203.0.113.7"), (b"x-forwarded-proto", b"https")]
    assert GATE.front("127.0.0.1", headers) == ("127.0.0.1", "http")
    proxied = Gate.loopback(8090, proxies=[ip_network("127.0.0.1"), ip_network("10.0.0.0/8")])
    assert proxied.front("127.0.0.1", headers) == ("203.0.113.7", "https")
    through_two = [(b"x-forwarded-for", b"203.0.113.7, 10.1.2.3")]
    assert proxied.front("127.0.0.1", through_two) == ("203.0.113.7", "http")
    assert proxied.front("127.0.0.1", [(b"x-forwarded-for", b"nonsense")]) == ("127.0.0.1", "http")
    assert proxied.front("192.0.2.1", headers) == ("192.0.2.1", "http")  # not a proxy
    odd_proto = [(b"x-forwarded-proto", b"javascript")]
    assert proxied.front("127.0.0.1", odd_proto) == ("127.0.0.1", "http")


def test_an_ipv6_client_is_counted_by_its_64() -> None:
    a = GATE.front("2001:db8:1:2::1", [])[0]
    b = GATE.front("2001:db8:1:2:ffff::9", [])[0]
    assert a == b == "2001:db8:1:2::/64"
    assert GATE.front("::ffff:192.0.2.1", [])[0] == "192.0.2.1"


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1, max_size=40).filter(lambda n: n not in DOTS))
def test_any_name_is_one_segment_and_reads_back(name: str) -> None:
    built = f"/campaigns/{segment(name)}/cancel"
    # what the server decodes from the wire (surrogates cannot travel: UTF-8 with replacement)
    raw = built.encode("ascii")
    routed = route_path(raw)
    parts = routed.split("/")
    assert len(parts) == 4
    assert parts[1] == "campaigns"
    assert parts[3] == "cancel"
    assert Segment().convert(parts[2]) == unquote(quote(name, safe=""))
    assert "/" not in parts[2]
    assert parts[2] not in DOTS


def _routed(path: str, method: str) -> list[str]:
    scope = {"type": "http", "path": path, "method": method}
    return [
        getattr(r, "path", "")
        for r in [*pages.routes(), *exports.routes(), *actions.routes()]
        if r.matches(scope)[0] is Match.FULL
    ]


@pytest.mark.parametrize("name", DOTS)
def test_a_name_of_dots_leads_nowhere(name: str) -> None:
    """A browser resolves a segment "." or ".." (or "%2E", "%2E%2E") away, whatever its
    escaping: the console cannot address such a campaign or template by its path, but no
    button for one reaches another page's action (a 404, nothing else)."""
    for built in (
        f"/campaigns/{segment(name)}/cancel",
        f"/campaigns/{segment(name)}/failures.csv",
        f"/templates/{segment(name)}/email/en",
        f"/templates/t/{segment(name)}/en",
        f"/templates/t/email/{segment(name)}",
    ):
        resolved = urlsplit(urljoin("http://localhost:8090/campaigns", built)).path
        for method in ("GET", "POST"):
            assert _routed(route_path(resolved.encode()), method) == [], (built, resolved)


def test_a_path_sent_with_slashes_in_a_name_stays_apart() -> None:
    assert route_path(b"/campaigns/y%2F..%2F..%2Fnotifications%2F19/cancel") == (
        "/campaigns/y%2F..%2F..%2Fnotifications%2F19/cancel"
    )
    assert route_path(b"/notific%61tions/1") == "/notifications/1"
    assert route_path(b"/a b/%e9") == "/a%20b/%E9"


def test_the_console_settings_are_parsed_once_and_refused_naming_the_variable(
    set_env: SetEnv,
) -> None:
    set_env(
        console_hosts="console.example.com,[::1]:8090",
        console_scheme="https",
        console_trusted_proxies="10.0.0.0/8",
    )
    s = get_settings()
    assert s.console_hosts == [HostPattern("console.example.com"), HostPattern("[::1]", 8090)]
    assert (s.console_scheme, [str(n) for n in s.console_trusted_proxies]) == (
        "https",
        ["10.0.0.0/8"],
    )
    set_env(console_hosts="https://console.example.com", console_scheme="ftp")
    with pytest.raises(SettingsError) as refused:
        get_settings()
    message = str(refused.value)
    assert "\n" not in message
    assert "NOTIFIER_CONSOLE_HOSTS: 'https://console.example.com' names a scheme" in message
    assert "NOTIFIER_CONSOLE_SCHEME: Input should be 'http' or 'https'" in message
