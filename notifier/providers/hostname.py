"""Host names no lookup can ever resolve, refused before any is made.

A row whose email domain or webhook host breaks the DNS's own rules would otherwise be tried
and retried: the lookup fails like a resolver that is away for a while, a transient error, until
the row's attempts run out. ``problem`` names what is wrong, for a ``Permanent`` outcome at
validation instead. The rules (RFC 1035 and 5890):

* at most 253 characters, one trailing dot (the root) aside; labels of 1 to 63 characters;
* a label is letters, digits and hyphens (and underscores, where the caller allows them: some
  webhook hosts have them, no mail domain does), and neither begins nor ends with a hyphen;
* a label starting ``xn--`` (an internationalised name's ASCII form, an A-label) must decode to
  Unicode and encode back to itself under IDNA 2008 (the ``idna`` package, as aiohttp and httpx
  use it) or, for names registered before it and still served (some with emoji), IDNA 2003
  (the standard library's ``encodings.idna``).

Names are checked in their ASCII form: a webhook host as the client will send it (``yarl``'s
``raw_host``), an email domain as the address gives it (which must be ASCII).
"""

from __future__ import annotations

import functools
import re
from encodings import idna as idna2003

import idna

MAX_NAME = 253
MAX_LABEL = 63
_LDH = re.compile(r"[a-z0-9-]+")
_LDH_UNDERSCORE = re.compile(r"[a-z0-9_-]+")


#: Names whose answer is kept: an audience's million addresses share a few hundred domains.
CACHED_NAMES = 4096


@functools.lru_cache(maxsize=CACHED_NAMES)
def problem(name: str, underscore: bool = False) -> str | None:
    """Why ``name`` (a host name, not an IP literal) can never be resolved, as the end of a
    sentence ("... is empty"); None when it may be. Answers for recent names are kept."""
    bare = name.removesuffix(".")
    if not bare:
        return "is empty"
    if len(bare) > MAX_NAME:
        return f"is {len(bare)} characters long; at most {MAX_NAME} allowed"
    allowed = _LDH_UNDERSCORE if underscore else _LDH
    for label in bare.lower().split("."):
        shown = repr(label[:70])
        if not label:
            return "has an empty label (two dots in a row, or a dot at the start)"
        if len(label) > MAX_LABEL:
            return f"has a label of {len(label)} characters; at most {MAX_LABEL} allowed"
        if not allowed.fullmatch(label):
            kinds = (
                "letters, digits, hyphens and underscores"
                if underscore
                else ("letters, digits and hyphens")
            )
            return f"has a label {shown} with other characters than {kinds}"
        if label.startswith("-") or label.endswith("-"):
            return f"has a label {shown} that begins or ends with a hyphen"
        if label.startswith("xn--") and not _decodes(label):
            return f"has a label {shown} that is not a valid internationalised (IDNA) label"
    return None


def _decodes(label: str) -> bool:
    """Whether an ``xn--`` label decodes and encodes back to itself, under IDNA 2008 or 2003."""
    try:
        if idna.encode(idna.decode(label)).decode() == label:
            return True
    except (idna.IDNAError, UnicodeError, ValueError):
        pass
    try:
        return bytes(idna2003.ToASCII(idna2003.ToUnicode(label))).decode() == label
    except (UnicodeError, ValueError):
        return False
