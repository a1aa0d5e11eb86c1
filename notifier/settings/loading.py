"""Reading the settings: ``get_settings()``, and the refusal of an environment it cannot use."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from functools import lru_cache

from pydantic import ValidationError

from notifier.settings.model import Settings

PREFIX = "NOTIFIER_"

#: ``NOTIFIER_*`` variables that are not settings yet are read on purpose: the test suite's and
#: the benchmarks' own.
NOT_SETTINGS = ("NOTIFIER_TEST_", "NOTIFIER_BENCH_", "NOTIFIER_FAULT_REPORT")


class SettingsError(ValueError):
    """A setting the environment gives that notifier cannot use, named as the variable."""


def unknown_settings(environ: Mapping[str, str]) -> list[str]:
    """One message per ``NOTIFIER_*`` variable that is no setting, naming the closest one.

    A misspelt variable is otherwise ignored without a word, and the setting it meant keeps its
    default: ``NOTIFIER_OVERRIDE_RECIPIENT`` would leave a staging deployment sending to real
    recipients. Names are compared without regard to case, as they are read.
    """
    known = {field.upper() for field in Settings.model_fields}
    problems = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(PREFIX) or upper.startswith(NOT_SETTINGS):
            continue
        field = upper[len(PREFIX) :]
        if field in known:
            continue
        close = difflib.get_close_matches(field, known, n=1)
        hint = (
            f"did you mean {PREFIX}{close[0]}?"
            if close
            else "the settings are listed in notifier/settings/"
        )
        problems.append(f"unknown setting {name}; {hint}")
    return problems


def _invalid(exc: ValidationError) -> list[str]:
    """Pydantic's errors, each naming the variable, never the value (it may hold a password)."""
    messages = []
    for error in exc.errors():
        variable = PREFIX + str(error["loc"][0]).upper() if error["loc"] else "a setting"
        message = error["msg"].removeprefix("Value error, ")
        messages.append(f"{variable}: {message}")
    return messages


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read from the environment on first use.

    Raises ``SettingsError``, one line naming every offending variable, when one holds a value
    that is no good or when a ``NOTIFIER_*`` variable is no setting at all.
    """
    problems = unknown_settings(os.environ)
    try:
        settings = Settings()
    except ValidationError as exc:
        problems += _invalid(exc)
    if problems:
        raise SettingsError("; ".join(problems))
    return settings
