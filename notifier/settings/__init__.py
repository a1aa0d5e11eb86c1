"""Every tunable of notifier, read once from the environment (prefix ``NOTIFIER_``).

Each field's docstring says what it does; its default is the value shown. The fields are
grouped by theme: ``delivery.py`` (rows, claims, retries, limits, retention), ``channels.py``
(the providers, the status webhook, the guard), ``surfaces.py`` (metrics, logs, the events
endpoint, the console); ``model.py`` joins them into ``Settings``. ``get_settings()`` is the one
way the rest of the package reads configuration, so a test can change the environment and call
``get_settings.cache_clear()``.
"""

from notifier.settings.channels import SmtpTls
from notifier.settings.loading import (
    NOT_SETTINGS,
    PREFIX,
    SettingsError,
    get_settings,
    unknown_settings,
)
from notifier.settings.model import SECRETS_DIR, Settings

__all__ = [
    "NOT_SETTINGS",
    "PREFIX",
    "SECRETS_DIR",
    "Settings",
    "SettingsError",
    "SmtpTls",
    "get_settings",
    "unknown_settings",
]
