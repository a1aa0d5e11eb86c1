"""Rendering, locales and overrides of ``notifier.delivery.prepare``, without a database."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from notifier.delivery.prepare import (
    Compiled,
    TemplateProblem,
    compile_parts,
    compile_template,
    locale_chain,
    normalize_locale,
    redirect,
    render,
)
from notifier.models import Notification
from notifier.settings import Settings
from notifier.specs import parse_overrides


def _n(payload: Any = None, **fields: Any) -> Notification:
    values: dict[str, Any] = {
        "id": 1,
        "channel": "email",
        "recipient": "ann@example.com",
        "subject": None,
        "body": None,
        "payload": {"first_name": "Ann"} if payload is None else payload,
        "attempts": 1,
        "max_attempts": 5,
        "claim_token": uuid.uuid4(),
        "created_at": datetime(2026, 1, 1, tzinfo=UTC),
        "template": "welcome",
    }
    values.update(fields)
    return Notification(**values)


def _t(
    subject: str | None = "Welcome, {{ first_name }}",
    body: str | None = "Hello {{ first_name }}, this is {{ recipient }}.",
    html: str | None = "<p>Hello {{ first_name }}</p>",
) -> Compiled:
    return compile_template("welcome", "email", "en", subject, body, html)


# -- rendering ----------------------------------------------------------------------------------


def test_parts_are_rendered_from_the_payload_and_the_recipient() -> None:
    row = _n(payload={"first_name": "Ann", "user": 42})
    out = render(_t(), row)
    assert out.subject == "Welcome, Ann"
    assert out.body == "Hello Ann, this is ann@example.com."
    assert out.payload == {"first_name": "Ann", "user": 42, "html": "<p>Hello Ann</p>"}
    assert (out.id, out.recipient, out.template) == (row.id, row.recipient, row.template)
    assert row.payload == {"first_name": "Ann", "user": 42}  # the claimed row is left alone


def test_template_syntax_in_the_payload_is_data_and_never_evaluated() -> None:
    sneaky = "{{ 7*7 }} {% for x in range(3) %}x{% endfor %} {{ ''.__class__ }}"
    out = render(_t(), _n(payload={"first_name": sneaky}))
    assert out.subject == f"Welcome, {sneaky}"
    assert "49" not in (out.body or "")
    assert out.payload["html"] == (
        "<p>Hello {{ 7*7 }} {% for x in range(3) %}x{% endfor %} {{ &#39;&#39;.__class__ }}</p>"
    )


def test_only_the_html_part_is_escaped() -> None:
    out = render(_t(), _n(payload={"first_name": "<b>Tom & Jerry</b>"}))
    assert out.subject == "Welcome, <b>Tom & Jerry</b>"
    assert out.body == "Hello <b>Tom & Jerry</b>, this is ann@example.com."
    assert out.payload["html"] == "<p>Hello &lt;b&gt;Tom &amp; Jerry&lt;/b&gt;</p>"


def test_a_part_the_template_lacks_keeps_the_rows_own() -> None:
    out = render(_t(subject=None, html=None), _n(subject="Hi", body="unused"))
    assert out.subject == "Hi"
    assert out.body == "Hello Ann, this is ann@example.com."
    assert "html" not in out.payload


def test_a_missing_variable_is_named() -> None:
    with pytest.raises(TemplateProblem) as caught:
        render(_t(), _n(payload={"name": "Ann"}))
    assert str(caught.value) == "template 'welcome' needs 'first_name', which the payload lacks"


def test_a_missing_attribute_says_what_is_missing() -> None:
    template = _t(subject=None, body="Hi {{ user.first_name }}", html=None)
    with pytest.raises(TemplateProblem, match=r"needs a value the payload lacks: .*'first_name'"):
        render(template, _n(payload={"user": {"name": "Ann"}}))


def test_defined_tests_and_defaults_still_work_under_strict_undefined() -> None:
    template = _t(
        subject="Hi {{ first_name | default('there') }}",
        body="{% if code is defined %}Code {{ code }}{% else %}No code{% endif %}",
        html=None,
    )
    out = render(template, _n(payload={}))
    assert (out.subject, out.body) == ("Hi there", "No code")


def test_the_sandbox_refuses_internals() -> None:
    template = _t(subject=None, body="{{ ''.__class__.__mro__[1].__subclasses__() }}", html=None)
    with pytest.raises(TemplateProblem, match=r"template 'welcome' \(email, en\) failed: Security"):
        render(template, _n())


def test_a_template_cannot_change_the_payload_it_reads() -> None:
    template = _t(subject=None, body="{{ user.update({'admin': true}) }}", html=None)
    row = _n(payload={"user": {"name": "Ann"}})
    with pytest.raises(TemplateProblem, match="SecurityError: access to attribute 'update'"):
        render(template, row)
    assert row.payload == {"user": {"name": "Ann"}}


def test_a_template_that_does_not_compile_names_part_and_line() -> None:
    broken = _t(body="Hello\n{{ first_name ")
    assert broken.error is not None
    with pytest.raises(TemplateProblem) as caught:
        render(broken, _n())
    assert str(caught.value).startswith(
        "template 'welcome' (email, en) does not compile: body line 2: "
    )
    with pytest.raises(ValueError, match=r"^html line 1: No filter named 'nope'"):
        compile_parts("ok", None, "{{ x | nope }}")


# -- locales ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("en", "en"),
        ("DE", "de"),
        ("de_at", "de-AT"),
        ("de-AT", "de-AT"),
        (" pt-br ", "pt-BR"),
        ("zh_hant_tw", "zh-Hant-TW"),
        ("es-419", "es-419"),
    ],
)
def test_locales_are_normalized(text: str, expected: str) -> None:
    assert normalize_locale(text) == expected


@pytest.mark.parametrize("text", ["", "de AT", "1de", "de--AT", "deutsch-österreich"])
def test_malformed_locales_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a locale like en, de or de-AT"):
        normalize_locale(text)


@pytest.mark.parametrize(
    ("locale", "default", "chain"),
    [
        ("de-AT", "en", ["de-AT", "de", "en"]),
        ("de_at", "en", ["de-AT", "de", "en"]),
        ("de", "en", ["de", "en"]),
        ("en-GB", "en", ["en-GB", "en"]),
        ("zh-Hant-TW", "en", ["zh-Hant-TW", "zh-Hant", "zh", "en"]),
        (None, "en", ["en"]),
        ("  ", "de", ["de"]),
    ],
)
def test_locale_chain(locale: str | None, default: str, chain: list[str]) -> None:
    assert locale_chain(locale, default) == chain


def test_default_locale_setting_is_normalized() -> None:
    assert Settings(default_locale="pt_br").default_locale == "pt-BR"
    with pytest.raises(ValidationError, match="is not a locale"):
        Settings(default_locale="?")


# -- overrides ----------------------------------------------------------------------------------


def test_overrides_are_parsed_by_channel() -> None:
    assert parse_overrides("") == {}
    assert parse_overrides(" email = qa@example.com ; sms=+14155550100; ") == {
        "email": "qa@example.com",
        "sms": "+14155550100",
    }
    assert parse_overrides("webhook=https://qa.example/hook?a=b") == {
        "webhook": "https://qa.example/hook?a=b"
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("qa@example.com", "is not channel=recipient"),
        ("email=", "is not channel=recipient"),
        ("=qa@example.com", "is not channel=recipient"),
        ("email=a@example.com;email=b@example.com", "channel 'email' is overridden twice"),
    ],
)
def test_a_malformed_override_is_a_settings_error(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_overrides(text)
    with pytest.raises(ValidationError, match=message):
        Settings(override_recipients=text)


def test_redirect_moves_only_the_overridden_channel() -> None:
    overrides = {"email": "qa@example.com"}
    row = _n(payload={"user": 42})
    out = redirect(row, overrides)
    assert out.recipient == "qa@example.com"
    assert out.payload == {"user": 42, "original_recipient": "ann@example.com"}
    assert row.recipient == "ann@example.com"
    webhook = _n(channel="webhook", recipient="https://example.com/h")
    assert redirect(webhook, overrides) is webhook
    # A payload that is not an object is refused later; the recipient moves all the same.
    assert redirect(_n(payload=[1]), overrides).recipient == "qa@example.com"
