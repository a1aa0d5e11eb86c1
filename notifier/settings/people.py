"""The settings of what the people notified asked for: the categories' defaults, the
categories that nothing a person chooses holds back, and quiet hours."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field
from pydantic_settings import BaseSettings, NoDecode

from notifier.settings.parsed import parsed
from notifier.specs import (
    Cap,
    QuietWindow,
    parse_categories,
    parse_category_defaults,
    parse_frequency_caps,
    parse_preference_center,
    parse_quiet_hours,
    parse_time_zone,
)


class PeopleSettings(BaseSettings):
    """Fields of ``Settings`` (``model.py``), the one class that reads them."""

    preference_defaults: Annotated[dict[str, bool], NoDecode, parsed(parse_category_defaults)] = (
        Field(default_factory=dict)
    )
    """What a person who never chose gets of each category, for rows addressed to a profile:
    ``marketing=off,digest=on``. A category not named is on. Where the law asks for consent
    before marketing (the EU's ePrivacy rules, for one), set ``marketing=off``: then only the
    people who turned it on in the preference center, or whom a producer recorded as having
    consented (``preferences``, source ``producer``), receive it."""

    critical_categories: Annotated[frozenset[str], NoDecode, parsed(parse_categories)] = Field(
        frozenset({"security"})
    )
    """Categories that preferences never hold back (``security,billing``): a person cannot turn
    off a sign-in alert. The suppression list still applies to them, as to every row."""

    quiet_hours: Annotated[dict[str, QuietWindow], NoDecode, parsed(parse_quiet_hours)] = Field(
        default_factory=dict
    )
    """When rows with a category wait rather than reach their person, in the person's time
    zone: ``*=22:00-07:00;marketing/sms=21:00-08:00``. ``*`` is every category's default, which a
    person's own window (the preference center, ``profiles.quiet_start``/``quiet_end``)
    replaces; a category (``marketing``) or a category on a channel (``marketing/sms``) adds a
    window nobody shortens. Transactional rows (no category) and critical categories are never
    held. Empty (the default): no quiet hours."""

    default_time_zone: Annotated[str, parsed(parse_time_zone)] = "UTC"
    """The time zone of quiet hours for rows whose person has none, or one this machine's time
    zone database does not know (an IANA name, e.g. ``America/New_York``)."""

    frequency_caps: Annotated[dict[str, Cap], NoDecode, parsed(parse_frequency_caps)] = Field(
        default_factory=dict
    )
    """At most so many messages of a category to one person (a profile, or an address) in a
    window, counted across every worker in Redis: ``marketing=1/d,3/7d;digest=2/d:wait``
    (windows ``N/s|m|h|d``, ``N/7d``). A row over its cap is cancelled, or with ``:wait``
    waits until the window allows it (``held``, no attempt used). Empty (the default): none."""

    preference_center: Annotated[
        dict[str, list[str]], NoDecode, parsed(parse_preference_center)
    ] = Field(default_factory=dict)
    """The categories, and their channels, a person may turn on and off on their preference
    center (``notifier events``' ``/p/`` pages, ``{{ preferences_url }}`` in templates):
    ``marketing=email,sms;digest=email``, listed in this order. Critical categories are shown
    as always sent. Empty (the default): no preference center."""
