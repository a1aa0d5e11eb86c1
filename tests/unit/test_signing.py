"""Standard Webhooks signing, held against the specification's published example: what lets a
receiver verify notifier's requests with any of the specification's libraries (none of which
the test environment installs), not only with a copy of notifier's own arithmetic."""

from __future__ import annotations

import time

import pytest

from notifier.signing import signature, signed_headers, signing_key

# The example of the Standard Webhooks specification (and of its libraries' own tests).
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TIMESTAMP = "1614265330"
SPEC_BODY = b'{"test": 2432232314}'
SPEC_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_the_specifications_example_is_signed_as_it_publishes() -> None:
    key = signing_key(SPEC_SECRET)
    assert signature(key, SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY) == SPEC_SIGNATURE


def test_a_request_is_stamped_now_and_signed_over_its_id_stamp_and_body() -> None:
    key = signing_key(SPEC_SECRET)
    headers = signed_headers(key, SPEC_ID, SPEC_BODY)
    assert headers["webhook-id"] == SPEC_ID
    assert abs(int(headers["webhook-timestamp"]) - time.time()) < 5
    stamp = headers["webhook-timestamp"]
    assert headers["webhook-signature"] == signature(key, SPEC_ID, stamp, SPEC_BODY)
    assert signature(key, SPEC_ID, stamp, SPEC_BODY + b" ") != headers["webhook-signature"]


def test_without_a_key_a_request_carries_its_id_and_stamp_but_no_signature() -> None:
    headers = signed_headers(None, SPEC_ID, SPEC_BODY)
    assert set(headers) == {"webhook-id", "webhook-timestamp"}


def test_a_secret_without_the_prefix_is_the_key_itself() -> None:
    assert signing_key("plain secret") == b"plain secret"


def test_a_prefixed_secret_that_is_not_base64_names_the_setting_and_not_the_value() -> None:
    with pytest.raises(ValueError, match="NOTIFIER_STATUS_WEBHOOK_SECRET") as raised:
        signing_key("whsec_not*base64!", "NOTIFIER_STATUS_WEBHOOK_SECRET")
    assert "not*base64" not in str(raised.value)
