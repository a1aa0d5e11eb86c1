"""Settings the environment gets wrong are named as the variables an operator wrote."""

from __future__ import annotations

import pytest

from notifier.settings import SettingsError, get_settings, unknown_settings
from tests.factories import SetEnv


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("NOTIFIER_RATE_LIMIT", "did you mean NOTIFIER_RATE_LIMITS?"),
        ("NOTIFIER_OVERRIDE_RECIPIENT", "did you mean NOTIFIER_OVERRIDE_RECIPIENTS?"),
        ("NOTIFIER_SMTP_HOSTNAME", "did you mean NOTIFIER_SMTP_HOST?"),
        ("notifier_batchsize", "did you mean NOTIFIER_BATCH_SIZE?"),
        ("NOTIFIER_COLOUR", "the settings are listed in notifier/settings/"),
    ],
)
def test_an_unknown_variable_is_named_with_the_closest_setting(name: str, says: str) -> None:
    assert unknown_settings({name: "1"}) == [f"unknown setting {name}; {says}"]


def test_settings_and_the_variables_read_on_purpose_pass() -> None:
    assert (
        unknown_settings(
            {
                "NOTIFIER_RATE_LIMITS": "",
                "notifier_batch_size": "5",  # read without regard to case, like every setting
                "NOTIFIER_TEST_POSTGRES": "postgresql://",
                "NOTIFIER_BENCH_REDIS": "redis://",
                "NOTIFIER_FAULT_REPORT": "/tmp/report",
                "PATH": "/usr/bin",
                "NOTIFIERX": "1",
            }
        )
        == []
    )


def test_get_settings_refuses_an_unknown_variable(set_env: SetEnv) -> None:
    set_env(rate_limit="email=1/s")
    with pytest.raises(SettingsError) as refused:
        get_settings()
    assert str(refused.value) == (
        "unknown setting NOTIFIER_RATE_LIMIT; did you mean NOTIFIER_RATE_LIMITS?"
    )


def test_bad_values_name_their_variables_on_one_line(set_env: SetEnv) -> None:
    set_env(batch_size=0, database_url="mysql://app:hunter2@db/app", smpt_host="mail")
    with pytest.raises(SettingsError) as refused:
        get_settings()
    message = str(refused.value)
    assert message == (
        "unknown setting NOTIFIER_SMPT_HOST; did you mean NOTIFIER_SMTP_HOST?; "
        "NOTIFIER_DATABASE_URL: must be a postgresql:// or postgresql+psycopg:// URL; "
        "NOTIFIER_BATCH_SIZE: Input should be greater than 0"
    )
    assert "hunter2" not in message
