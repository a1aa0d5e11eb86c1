"""How a setting whose value has a grammar of its own (``notifier.specs``) is read from text."""

from __future__ import annotations

from collections.abc import Callable
from ipaddress import IPv4Network, IPv6Network
from typing import Annotated, Any

from pydantic import BeforeValidator
from pydantic_settings import NoDecode

from notifier.specs import parse_networks


def parsed(parse: Callable[[str], Any]) -> BeforeValidator:
    """Parse the environment's text with ``parse`` (``NoDecode`` keeps it from JSON), whose
    ``ValueError`` names what it expects; a value given already parsed passes on."""
    return BeforeValidator(lambda value: parse(value) if isinstance(value, str) else value)


Networks = Annotated[list[IPv4Network | IPv6Network], NoDecode, parsed(parse_networks)]
