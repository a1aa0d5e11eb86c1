"""Log lines: the JSON formatter's output parses, carries ``extra`` fields and masks recipients."""

from __future__ import annotations

import io
import json
import logging
import string
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from notifier import logs
from notifier.settings import Settings


@pytest.mark.parametrize(
    ("recipient", "masked"),
    [
        ("ann@example.com", "a***@example.com"),
        ("  bob.smith+tag@mail.example.org ", "b***@mail.example.org"),
        ("+14155550100", "+1***0100"),
        ("+447700900123", "+44***0123"),
        ("+353861234567", "+353***4567"),
        ("https://hooks.example.com/T0/B1/secret?token=x", "https://hooks.example.com/***"),
        ("https://user:pw@hooks.example.com:8443/x", "https://hooks.example.com:8443/***"),
        ("https://hooks.example.com", "https://hooks.example.com"),
        ("https://user:pw@hooks.example.com", "https://hooks.example.com/***"),
        ("fcm-token-abc123:APA91b", "fcm-***"),
        ("short-token", "s***"),
        ("4155550100", "***0100"),
        ("+353861234", "***34"),
        ("+3538612", "+***"),
        ("", ""),
    ],
)
def test_mask_recipient(recipient: str, masked: str) -> None:
    assert logs.mask_recipient(recipient) == masked


def test_scrub_masks_recipients_inside_free_text() -> None:
    text = (
        "send to ann@example.com failed; POST https://hooks.example.com/abc/secret refused;"
        " sms +14155550100 queued at 2026-11-30T10:00:00+00:00 (id 12345678)"
    )
    assert logs.scrub(text) == (
        "send to a***@example.com failed; POST https://hooks.example.com/*** refused;"
        " sms +1***0100 queued at 2026-11-30T10:00:00+00:00 (id 12345678)"
    )


def test_scrub_masks_what_the_narrow_patterns_missed() -> None:
    token = "cXk3bE9tRkZ1QmF6:APA91bH" + "x7" * 60
    text = (
        f'o\'brien@example.com jörg.müller@example.de "john doe"@example.com'
        f" +1 415 555 0100 token={token} claim 5f0c7e0e-8a1b-4c7e-9d3f-2a6b1c0d9e8f"
    )
    assert logs.scrub(text) == (
        'o***@example.com j***@example.de "***@example.com'
        " +1***0100 token=cXk3*** claim 5f0c7e0e-8a1b-4c7e-9d3f-2a6b1c0d9e8f"
    )


@pytest.mark.parametrize(
    ("text", "scrubbed"),
    [
        # the worker's outcome line: the recipient is masked already, and stays as it was
        (
            "notification 7 dead: channel='email' recipient='d***@example.com' reason=bounced",
            "notification 7 dead: channel='email' recipient='d***@example.com' reason=bounced",
        ),
        (
            "channel='email' recipient='dora@example.com' reason=x",
            "channel='email' recipient='d***@example.com' reason=x",
        ),
        ('to=ann@example.com, cc="bob@example.org"', 'to=a***@example.com, cc="b***@example.org"'),
        ("(see <ann@example.com>).", "(see <a***@example.com>)."),
        # uvicorn's start line: an address with no path hides nothing
        (
            "Uvicorn running on http://127.0.0.1:8090 (Press CTRL+C to quit)",
            "Uvicorn running on http://127.0.0.1:8090 (Press CTRL+C to quit)",
        ),
        (
            "POST https://hooks.example.com:8443/T0/secret?sig=1, then (https://x.example.net/a).",
            "POST https://hooks.example.com:8443/***, then (https://x.example.net/***).",
        ),
        ("url='https://u:pw@[::1]:9000/x'", "url='https://[::1]:9000/***'"),
        # an IPv6 host's closing bracket belongs to the URL, a bracket after it does not
        ("on http://[::1] now", "on http://[::1] now"),
        ("[see http://[::1]/x]", "[see http://[::1]/***]"),
    ],
)
def test_scrub_keeps_the_text_around_an_address(text: str, scrubbed: str) -> None:
    assert logs.scrub(text) == scrubbed


_WORD = st.text(st.sampled_from(string.ascii_letters), min_size=1, max_size=12)
_ALNUM = st.sampled_from(string.ascii_lowercase + string.digits)
_EMAILS = st.builds(
    lambda first, middle, last, domain: f"{first}{middle}{last}@{domain}",
    _ALNUM,
    st.text(st.sampled_from(string.ascii_letters + string.digits + "._+'-"), max_size=10),
    _ALNUM,
    st.sampled_from(["example.com", "mail.example.de", "x-y.example.co.uk"]),
)
_URLS = st.builds(
    lambda scheme, host, port, path, query: f"{scheme}://{host}{port}{path}{query}",
    st.sampled_from(["http", "https"]),
    st.sampled_from(["hooks.example.com", "10.0.0.1", "[::1]", "localhost"]),
    st.sampled_from(["", ":8443", ":80"]),
    st.sampled_from(["", "/"]) | st.from_regex(r"\A(/[A-Za-z0-9_-]{1,12}){1,3}\Z"),
    st.sampled_from(["", "?token=abc", "?a=1&b=2#frag"]),
)
_PHONES = st.from_regex(r"\A\+[1-9][0-9]{9,13}\Z")
_TOKENS = st.builds(
    lambda a, b: f"{a}:{b}",
    st.text(st.sampled_from(string.ascii_letters + string.digits + "_-"), min_size=16, max_size=24),
    st.text(st.sampled_from(string.ascii_letters + string.digits + "_-"), min_size=32, max_size=48),
)
_BEFORE = st.sampled_from(["", "'", '"', "(", "<", "to=", "recipient='", 'url="'])
_AFTER = st.sampled_from(["", "'", '"', ")", ">", ",", ".", ";", ")."])
#: A piece of text: a word, or an address between what may surround it (``after`` of a token
#: is never ``:``, which would make it part of the token).
_PIECES = st.one_of(
    _WORD.map(lambda w: (w, None)),
    st.tuples(_BEFORE, st.one_of(_EMAILS, _URLS, _PHONES, _TOKENS), _AFTER),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_PIECES, min_size=1, max_size=8), st.sampled_from([" ", "\n", " - "]))
def test_masking_changes_only_the_addresses(pieces: list[tuple[str, ...]], glue: str) -> None:
    """For text made of words and addresses, the masked text is the same text with each
    address, and only it, replaced by what ``mask_recipient`` makes of it."""
    text, expected = [], []
    for piece in pieces:
        if len(piece) == 2:
            text.append(piece[0])
            expected.append(piece[0])
        else:
            before, address, after = piece
            text.append(f"{before}{address}{after}")
            expected.append(f"{before}{logs.mask_recipient(address)}{after}")
    assert logs.scrub(glue.join(text)) == glue.join(expected)


_LOCAL = st.text(st.sampled_from(string.ascii_letters + string.digits + "!#$%&'*+/=?^_`{|}~.-ö"))
_TOKEN = st.text(st.sampled_from(string.ascii_letters + string.digits + "_-"), min_size=16)


# A local part of one character and masks ("a**") reads like its own masked form: not a leak.
@given(
    _LOCAL.filter(lambda s: len(s) >= 3 and s[1:].strip("*")),
    st.sampled_from(["example.com", "mail.example.de"]),
)
def test_no_email_local_part_survives_masking(local: str, domain: str) -> None:
    address = f"{local}@{domain}"
    assert local not in logs.mask_recipient(address).removesuffix(f"@{domain}")
    assert f"{local}@" not in logs.scrub(f"bounce from {address}: mailbox full")


@given(st.from_regex(r"\A\+?[1-9][0-9]{7,14}\Z"))
def test_no_phone_number_survives_masking(number: str) -> None:
    digits = number.lstrip("+")
    assert digits not in logs.mask_recipient(number)
    if number.startswith("+"):  # in free text, bare digits are ids and counts as often
        assert digits not in logs.scrub(f"sms to {number} refused")


@given(_TOKEN, _TOKEN.filter(lambda s: len(s) >= 32))
def test_no_push_token_survives_masking(instance: str, rest: str) -> None:
    token = f"{instance}:{rest}"
    for masked in (logs.mask_recipient(token), logs.scrub(f"FCM said {token} is unregistered")):
        assert token not in masked
        assert rest not in masked


@given(st.sampled_from(["hooks.example.com", "10.0.0.1"]), _TOKEN)
def test_no_webhook_path_survives_masking(host: str, secret: str) -> None:
    url = f"https://{host}/hooks/{secret}?sig={secret}"
    assert logs.mask_recipient(url) == f"https://{host}/***"
    assert secret not in logs.scrub(f"POST {url} timed out")


def _record(msg: str, *args: object, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord(
        "notifier.delivery.dispatcher", logging.INFO, __file__, 1, msg, args, None
    )
    record.__dict__.update(extra)
    return record


def test_the_batch_summary_is_one_json_object_with_its_fields() -> None:
    extra = {
        "event": "batch",
        "claimed": 100,
        "sent": 97,
        "retried": 2,
        "dead": 1,
        "cancelled": 0,
        "released": 0,
        "stale": 0,
        "took": 0.412,
    }
    line = logs.JsonFormatter().format(
        _record("batch claimed=%d sent=%d took=%.3fs", 100, 97, 0.412, **extra)
    )
    entry = json.loads(line)
    assert "\n" not in line
    assert entry["message"] == "batch claimed=100 sent=97 took=0.412s"
    assert {k: entry[k] for k in extra} == extra
    assert (entry["level"], entry["logger"]) == ("INFO", "notifier.delivery.dispatcher")
    assert entry["ts"].endswith("+00:00")


def test_json_masks_recipient_fields_messages_and_tracebacks() -> None:
    try:
        raise ConnectionError("could not reach https://hooks.example.com/secret/path")
    except ConnectionError:
        record = logging.LogRecord(
            "notifier.providers",
            logging.ERROR,
            __file__,
            1,
            "send to %s failed",
            ("ann@example.com",),
            exc_info=sys.exc_info(),
        )
    record.__dict__.update(
        recipient="+14155550100",
        recipients=["bob@example.com", "https://x.example.net/t"],
        detail={"to": "carol@example.com", "n": 3},
    )
    line = logs.JsonFormatter().format(record)
    entry = json.loads(line)
    assert entry["message"] == "send to a***@example.com failed"
    assert entry["recipient"] == "+1***0100"
    assert entry["recipients"] == ["b***@example.com", "https://x.example.net/***"]
    assert entry["detail"] == {"to": "c***@example.com", "n": 3}
    assert "ConnectionError" in entry["exc_info"]
    for secret in ("ann@", "4155550100", "/secret/path", "bob@", "carol@"):
        assert secret not in line


@pytest.mark.usefixtures("restore_logging")
def test_configure_gives_the_command_line_json_or_masked_text() -> None:
    out = io.StringIO()
    logs.configure(Settings(log_format="json"), stream=out)
    logs.configure(Settings(log_format="json"), stream=out)  # again: still one handler
    logging.getLogger("notifier.test").warning("to %s", "ann@example.com", extra={"n": 1})
    (line,) = out.getvalue().splitlines()
    assert json.loads(line) | {"ts": None, "process": None} == {
        "ts": None,
        "process": None,
        "level": "WARNING",
        "logger": "notifier.test",
        "message": "to a***@example.com",
        "n": 1,
    }

    out = io.StringIO()
    logs.configure(Settings(log_format="text"), stream=out)
    logging.getLogger("notifier.test").warning("to %s", "ann@example.com")
    assert out.getvalue().rstrip().endswith("WARNING notifier.test: to a***@example.com")


def test_configure_reformats_the_handlers_celery_set_up() -> None:
    """What the ``after_setup_logger`` signal handler does with Celery's logger."""
    logger = logging.Logger("celery-like")
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("[%(levelname)s/%(processName)s] %(message)s"))
    logger.addHandler(handler)

    logs.configure(Settings(log_format="text"), logger)
    logs.configure(Settings(log_format="text"), logger)  # not wrapped twice
    logger.warning("webhook https://hooks.example.com/s3cret refused")
    assert out.getvalue() == "[WARNING/MainProcess] webhook https://hooks.example.com/*** refused\n"

    logs.configure(Settings(log_format="json"), logger)
    logger.info("batch", extra={"claimed": 3})
    entry = json.loads(out.getvalue().splitlines()[-1])
    assert (entry["message"], entry["claimed"]) == ("batch", 3)


def test_an_unknown_log_format_is_refused() -> None:
    with pytest.raises(ValueError, match="log_format"):
        Settings(log_format="xml")
