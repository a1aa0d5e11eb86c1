"""Host names no lookup can resolve (``notifier.providers.hostname``), as the email and webhook
validations use them: what a producer writes into a recipient, at its worst."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from encodings import idna as idna2003
from urllib.parse import urlsplit
from uuid import uuid4

import idna
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from notifier.models import Notification
from notifier.providers import hostname
from notifier.providers.base import InvalidNotification, Provider
from notifier.providers.email import EmailProvider
from notifier.providers.webhook import WebhookProvider
from notifier.settings import Settings

LDH = st.text("abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=70)
#: Labels as producers write them, good and bad: plain, A-labels of real Unicode labels, and
#: ``xn--`` followed by anything.
UNICODE_LABELS = st.text(
    st.characters(categories=["Ll", "Lo", "Nd"], max_codepoint=0x2FFF), min_size=1, max_size=20
)


def _a_label(label: str) -> str | None:
    try:
        return idna.encode(label).decode()
    except (idna.IDNAError, UnicodeError):
        return None


LABELS = st.one_of(
    LDH,
    UNICODE_LABELS.map(_a_label).filter(lambda a: a is not None),  # type: ignore[arg-type]
    st.builds(lambda rest: "xn--" + rest, st.text("abcdefghijklmnopqrstuvwxyz0123456789-")),
    st.sampled_from(["", "-", "xn--", "XN--MLAUT-JVA", "a_b", "%65x", "a.b"]),
)
DOMAINS = st.lists(LABELS, min_size=1, max_size=6).map(".".join)


def _decodes(label: str) -> bool:
    for decode, encode in (
        (idna.decode, lambda u: idna.encode(u).decode()),
        (idna2003.ToUnicode, lambda u: bytes(idna2003.ToASCII(u)).decode()),
    ):
        try:
            if encode(decode(label)) == label:
                return True
        except (idna.IDNAError, UnicodeError, ValueError):
            pass
    return False


@settings(max_examples=300, deadline=None)
@given(DOMAINS)
def test_a_name_passes_only_if_every_rule_of_the_dns_holds(name: str) -> None:
    found = hostname.problem(name)
    labels = name.removesuffix(".").lower().split(".")
    expected = (
        0 < len(name.removesuffix(".")) <= 253
        and all(0 < len(label) <= 63 for label in labels)
        and all(re.fullmatch(r"[a-z0-9-]+", label) for label in labels)
        and not any(label.startswith("-") or label.endswith("-") for label in labels)
        and all(_decodes(label) for label in labels if label.startswith("xn--"))
    )
    assert (found is None) == expected, (name, found)


@settings(max_examples=200, deadline=None)
@given(st.lists(UNICODE_LABELS, min_size=1, max_size=4))
def test_every_internationalised_name_in_its_ascii_form_passes(labels: list[str]) -> None:
    try:
        name = idna.encode(".".join([*labels, "example"])).decode()
    except (idna.IDNAError, UnicodeError):
        assume(False)
        return
    assume(len(name) <= 253)
    assert hostname.problem(name) is None
    assert hostname.problem(name + ".") is None  # the root's dot


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("", "is empty"),
        (".", "is empty"),
        ("a..example", "has an empty label"),
        (".example", "has an empty label"),
        ("a" * 64 + ".example", "has a label of 64 characters; at most 63 allowed"),
        (".".join(["a" * 63] * 4) + ".com", "is 259 characters long; at most 253 allowed"),
        ("-shop.example", "has a label '-shop' that begins or ends with a hyphen"),
        ("shop-.example", "has a label 'shop-' that begins or ends with a hyphen"),
        ("xn--.com", "has a label 'xn--' that begins or ends with a hyphen"),
        ("xn--zz.com", "has a label 'xn--zz' that is not a valid internationalised (IDNA) label"),
        ("xn--a.com", "has a label 'xn--a' that is not a valid internationalised"),
        ("shop_1.example", "other characters than letters, digits and hyphens"),
    ],
)
def test_each_rule_is_named(name: str, reason: str) -> None:
    assert reason in (hostname.problem(name) or "")


@pytest.mark.parametrize(
    "name",
    [
        "example.com",
        "xn--mlaut-jva.de",  # ümlaut.de
        "XN--MLAUT-JVA.DE",
        "xn--ls8h.la",  # an IDNA 2003 name, still registered and served
        "ab--cd.example",  # hyphens in 3rd and 4th place, not xn--: an ordinary name
        "a" * 63 + ".example",
        ".".join(["a" * 63] * 3) + "." + "b" * 61,  # 253
    ],
)
def test_names_that_may_resolve_pass(name: str) -> None:
    assert hostname.problem(name) is None


def _row(channel: str, recipient: str) -> Notification:
    return Notification(
        id=1,
        channel=channel,
        recipient=recipient,
        subject="s",
        body="b",
        payload={},
        attempts=1,
        max_attempts=5,
        claim_token=uuid4(),
        created_at=datetime.now(UTC),
    )


def _refusal(provider: Provider, row: Notification) -> str | None:
    """Why ``provider`` refuses ``row``; None if it takes it. Any other exception fails."""
    try:
        provider.validate(row)
    except InvalidNotification as exc:
        return str(exc)
    return None


@settings(max_examples=300, deadline=None)
@given(st.one_of(DOMAINS, st.text(max_size=80)))
def test_an_email_domain_is_refused_as_a_malformed_recipient_exactly_when_it_breaks_a_rule(
    domain: str,
) -> None:
    address = f"user@{domain}"
    shaped = re.fullmatch(r"[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+", domain) is not None
    refusal = _refusal(EmailProvider(Settings()), _row("email", address))
    if refusal is None:
        assert shaped
        assert hostname.problem(domain) is None
    else:
        assert refusal.startswith("recipient ")
        assert "\n" not in refusal
        assert not shaped or hostname.problem(domain) is not None


@settings(max_examples=300, deadline=None)
@given(host=DOMAINS, port=st.integers(min_value=0, max_value=99_999))
def test_a_webhook_url_passes_only_with_a_port_and_host_a_connection_can_reach(
    host: str, port: int
) -> None:
    url = f"https://{host}:{port}/hook"
    refusal = _refusal(WebhookProvider(Settings()), _row("webhook", url))
    if refusal is None:
        assert 1 <= port <= 65535
        assert hostname.problem(host, underscore=True) is None
    else:
        # A host drawn as a dotted quad (0.0.0.0) may be refused as an internal address instead.
        assert refusal.startswith(("recipient ", "webhook target "))
        assert "\n" not in refusal
        if port == 0 and urlsplit(url).hostname:  # an absolute URL, refused for its port
            assert "port 0, which no connection can reach" in refusal


def test_the_default_port_and_an_explicit_one_pass() -> None:
    provider = WebhookProvider(Settings())
    for url in (
        "https://hooks.example.com/x",
        "https://hooks.example.com:1/x",
        "https://hooks.example.com:65535/x",
    ):
        provider.validate(_row("webhook", url))
    for url, reason in (
        ("https://hooks.example.com:0/x", "port 0"),
        ("https://hooks.example.com:000/x", "port 0"),
        ("https://hooks.example.com:65536/x", "Port out of range"),
    ):
        with pytest.raises(InvalidNotification, match=reason):
            provider.validate(_row("webhook", url))
