"""The settings of what the people notified asked for: the categories' defaults and the
categories that nothing a person chooses holds back."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field
from pydantic_settings import BaseSettings, NoDecode

from notifier.settings.parsed import parsed
from notifier.specs import parse_categories, parse_category_defaults


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
